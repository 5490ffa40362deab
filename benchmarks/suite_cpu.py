"""Where the test suite's CPU goes, and which tests wait instead of work.

  ./scripts/test.sh -p benchmarks.suite_cpu     # one JSON line per test
  python -m benchmarks.suite_cpu [DIR] [--top 20]

As a pytest plugin (`-p benchmarks.suite_cpu`) it records, for each test
(setup, call and teardown together), its start, its wall time and the CPU
time of its xdist worker and of the children the worker waited for, in
DIR/<worker>.jsonl (DIR: $SUITE_CPU_DIR, else ./suite_cpu). Run as a script
it prints, as Markdown for benchmarks/HISTORY.md: each worker's wall and CPU,
the CPU per test file, the tests that use the most CPU, and the *waiting*
tests: over 10 s of wall with under a third of it on a CPU (a timeout, a
sleep, or a stall; this found the idle tf.data iterators whose destruction
blocked later tests for up to a minute, 2026-11-26).

Not seen: the CPU of processes nobody in the worker waited for, such as
those sshd starts on the multi-host tests' namespace hosts; they are
counted when the module's cluster stops, on its last test.
"""

import argparse
import collections
import glob
import json
import os
import resource
import sys
import time
from typing import Dict, List

_DIR_VAR = 'SUITE_CPU_DIR'
# A test "waits" when it used under this share of its wall time on a CPU.
_WAITING_SHARE = 1 / 3
_WAITING_MIN_SECONDS = 10.0


def _cpu_seconds():
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime,
          children.ru_utime + children.ru_stime)


try:
  import pytest  # pylint: disable=g-import-not-at-top
except ImportError:  # The report needs no pytest.
  pytest = None

if pytest is not None:
  _log = []  # The open log file, once the first test starts.

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    del nextitem
    if not _log:
      out_dir = os.environ.get(_DIR_VAR, 'suite_cpu')
      os.makedirs(out_dir, exist_ok=True)
      worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
      _log.append(open(os.path.join(out_dir, f'{worker}.jsonl'), 'a'))
    start = time.time()
    own, children = _cpu_seconds()
    yield
    own_after, children_after = _cpu_seconds()
    _log[0].write(json.dumps({
        'id': item.nodeid.split('@')[0], 'start': start,
        'wall': time.time() - start, 'own_cpu': own_after - own,
        'children_cpu': children_after - children}) + '\n')
    _log[0].flush()


def read(directory: str) -> Dict[str, List[dict]]:
  """The records, per worker."""
  records = {}
  for path in sorted(glob.glob(os.path.join(directory, '*.jsonl'))):
    with open(path) as f:
      records[os.path.basename(path)[:-len('.jsonl')]] = [
          json.loads(line) for line in f if line.strip()]
  return records


def _cpu(record: dict) -> float:
  return record['own_cpu'] + record['children_cpu']


def report(records: Dict[str, List[dict]], top: int) -> str:
  every = [r for worker in records.values() for r in worker]
  lines = ['| worker | tests | wall (tests) | CPU | of which children |',
           '|---|---|---|---|---|']
  for worker, rows in records.items():
    lines.append(f'| {worker} | {len(rows)} | '
                 f'{sum(r["wall"] for r in rows):,.0f} s | '
                 f'{sum(_cpu(r) for r in rows):,.0f} s | '
                 f'{sum(r["children_cpu"] for r in rows):,.0f} s |')
  per_file = collections.Counter()
  for r in every:
    per_file[r['id'].split('::')[0]] += _cpu(r)
  lines += ['', '| file | CPU |', '|---|---|']
  lines += [f'| `{name}` | {seconds:,.0f} s |'
            for name, seconds in per_file.most_common(top)]
  lines += ['', '| test | CPU | wall |', '|---|---|---|']
  lines += [f'| `{r["id"]}` | {_cpu(r):.1f} s | {r["wall"]:.1f} s |'
            for r in sorted(every, key=_cpu, reverse=True)[:top]]
  waiting = [r for r in every if r['wall'] > _WAITING_MIN_SECONDS and
             _cpu(r) < _WAITING_SHARE * r['wall']]
  lines += ['', f'Waiting tests (over {_WAITING_MIN_SECONDS:.0f} s, under a '
            'third of it on a CPU):', '', '| test | wall | CPU |',
            '|---|---|---|']
  lines += [f'| `{r["id"]}` | {r["wall"]:.1f} s | {_cpu(r):.1f} s |'
            for r in sorted(waiting, key=lambda r: r['wall'], reverse=True)]
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('directory', nargs='?',
                      default=os.environ.get(_DIR_VAR, 'suite_cpu'))
  parser.add_argument('--top', type=int, default=20)
  args = parser.parse_args(argv)
  records = read(args.directory)
  if not records:
    sys.exit(f'error: no *.jsonl records in {args.directory}; run the suite '
             'with -p benchmarks.suite_cpu first')
  print(report(records, args.top))


if __name__ == '__main__':
  main()
