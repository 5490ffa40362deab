"""This machine's pace at the test suite's kind of work, now: seconds for the
tiny recipe's run in a fresh process (the interpreter, TensorFlow's
import, tracing, 8 steps, an evaluation), one such run per core at once,
as the suite's workers and the jobs they start share the cores.

  python -m benchmarks.pace [--rounds 1]

Prints one line: `pace: <seconds> s ...`, the median wall time of the
runs. The suite's budget and its per-test limits are scaled by it
(tests/support/budget.py): a machine, or a machine under load, that takes
twice as long gets twice the time. Load counts on purpose: the pace is what
the suite will meet; one run per core so that load on any core shows, as it
does to the suite.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN = ['resnet_ctl_imagenet_main.py', '--use_synthetic_data',
        '--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--num_classes=10', '--batch_size=8', '--train_steps=8',
        '--steps_per_loop=2', '--log_steps=2', '--num_eval_examples=13',
        '--plots=False', '--enable_checkpoint_and_export=false']


def _start(root: str) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable] + _RUN + [f'--model_dir={root}/model'], cwd=REPO_ROOT,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def one_round() -> List[float]:
  """Wall seconds of each of one-per-core tiny runs started together
  (raises if one fails)."""
  seconds = []
  with tempfile.TemporaryDirectory(prefix='pace_') as root:
    started = time.monotonic()
    runs = [_start(os.path.join(root, str(i)))
            for i in range(os.cpu_count() or 1)]
    for run in runs:
      _, err = run.communicate()
      seconds.append(time.monotonic() - started)
      if run.returncode != 0:
        raise RuntimeError('the pace run failed: ' + err[-500:])
  return seconds


def measure(rounds: int = 1) -> float:
  return statistics.median(t for _ in range(rounds) for t in one_round())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=1)
  args = parser.parse_args()
  print(f'pace: {measure(args.rounds):.2f} s (the tiny recipe in a fresh '
        f'process, {os.cpu_count()} at once, median of {args.rounds} '
        'round(s))')


if __name__ == '__main__':
  main()
