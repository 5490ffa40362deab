"""Redraws a run's plots from its metrics.jsonl (curves.py), at any time.

  python -m resnet_keras.plots MODEL_DIR
"""

import os
from typing import List

from common import cli
from common.errors import UsageError
from resnet_keras.training import curves
from resnet_keras.rundir import ownership


def main(argv: List[str]) -> None:
  if len(argv) != 2 or argv[1].startswith('-'):
    raise UsageError('usage: python -m resnet_keras.plots MODEL_DIR (a '
                     'directory a training run wrote metrics.jsonl to)')
  model_dir = argv[1]
  if not os.path.isdir(model_dir):
    raise UsageError(f'{model_dir} is not a directory')
  curves.drawable_records(model_dir)  # Before taking the run: what it lacks.
  with ownership.take(model_dir, 'resnet_keras.plots', flag='MODEL_DIR',
                      new_run=False):
    for path in curves.write_plots(model_dir):
      print(path)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main)


if __name__ == '__main__':
  run()
