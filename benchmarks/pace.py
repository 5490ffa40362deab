"""This machine's pace at the test suite's kind of work, now: seconds for the
tiny recipe's run in a fresh process (the interpreter, TensorFlow's
import, tracing, 8 steps, an evaluation, a checkpoint), as the suite's
many short runs and jobs pay it.

  python -m benchmarks.pace [--runs 1]

Prints one line: `pace: <seconds> s ...`, the median of --runs. The suite's
budget and its per-test limits are scaled by it (tests/support/budget.py):
a machine, or a machine under load, that takes twice as long gets twice
the time. Load counts on purpose: the pace is what the suite will meet.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN = ['resnet_ctl_imagenet_main.py', '--use_synthetic_data',
        '--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--num_classes=10', '--batch_size=8', '--train_steps=8',
        '--steps_per_loop=2', '--log_steps=2', '--num_eval_examples=13',
        '--plots=False', '--enable_checkpoint_and_export=false']


def one_run() -> float:
  """Wall seconds of one tiny run in a fresh process (raises if it fails)."""
  with tempfile.TemporaryDirectory(prefix='pace_') as root:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable] + _RUN + [f'--model_dir={root}/model'],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
  if done.returncode != 0:
    raise RuntimeError('the pace run failed: ' + done.stderr[-500:])
  return seconds


def measure(runs: int = 1) -> float:
  return statistics.median(one_run() for _ in range(runs))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', type=int, default=1)
  args = parser.parse_args()
  print(f'pace: {measure(args.runs):.2f} s (the tiny recipe in a fresh '
        f'process, median of {args.runs})')


if __name__ == '__main__':
  main()
