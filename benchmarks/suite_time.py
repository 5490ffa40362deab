"""Where the test suite's time goes: the slowest tests and files.

  ./scripts/test.sh --durations=0 | tee suite.log
  python -m benchmarks.suite_time suite.log [--top 15]

Reads pytest's `--durations=0` report (setup, call and teardown of each
test, as the xdist workers measured them) and prints, as Markdown tables for
benchmarks/HISTORY.md: the slowest tests (their phases added), the time per
test file, and the run's wall time beside the sum of the tests' times (their
ratio is how well the workers were kept busy). No test asserts a time: this
is how the suite's budget is kept.
"""

import argparse
import collections
import re
from typing import Dict, Iterable, List, Optional, Tuple

_PHASE = re.compile(r'^([0-9.]+)s (?:call|setup|teardown)\s+(\S+)')
_SUMMARY = re.compile(r'(\d+) passed.* in ([0-9.]+)s')


def parse(lines: Iterable[str]) -> Tuple[Dict[str, float], Optional[Tuple[int, float]]]:
  """(seconds per test id, (tests passed, wall seconds) or None).

  xdist appends '@group' to the ids of grouped tests; it is dropped.
  """
  per_test: Dict[str, float] = collections.defaultdict(float)
  summary = None
  for line in lines:
    phase = _PHASE.match(line)
    if phase:
      per_test[phase.group(2).split('@')[0]] += float(phase.group(1))
      continue
    done = _SUMMARY.search(line)
    if done:
      summary = int(done.group(1)), float(done.group(2))
  return dict(per_test), summary


def per_file(per_test: Dict[str, float]) -> Dict[str, float]:
  files: Dict[str, float] = collections.defaultdict(float)
  for test, seconds in per_test.items():
    files[test.split('::')[0]] += seconds
  return dict(files)


def table(rows: List[Tuple[str, float]], header: str) -> str:
  lines = [f'| {header} | s |', '|---|---|']
  lines += [f'| `{name}` | {seconds:.1f} |' for name, seconds in rows]
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('log', help="pytest's output with --durations=0")
  parser.add_argument('--top', type=int, default=15)
  args = parser.parse_args()
  with open(args.log) as f:
    per_test, summary = parse(f)
  if not per_test:
    raise SystemExit(f'error: no durations in {args.log}; run pytest with '
                     '--durations=0')
  slowest = sorted(per_test.items(), key=lambda kv: -kv[1])[:args.top]
  print(table(slowest, f'slowest {len(slowest)} tests'))
  print()
  files = sorted(per_file(per_test).items(), key=lambda kv: -kv[1])
  print(table(files[:args.top], f'slowest {min(args.top, len(files))} files'))
  total = sum(per_test.values())
  print()
  if summary:
    passed, wall = summary
    print(f'{passed} passed in {wall:.0f} s wall; the tests\' own times add '
          f'up to {total:.0f} s ({total / wall:.2f} workers busy on average)')
  else:
    print(f'the tests\' own times add up to {total:.0f} s')


if __name__ == '__main__':
  main()
