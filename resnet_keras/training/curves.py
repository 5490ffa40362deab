"""The curves of a run's metrics.jsonl drawn as PNGs: loss, accuracy,
learning rate, img/s.

Writes MODEL_DIR/plots/{loss,accuracy,learning_rate,examples_per_second}.png
against the global step. The trainer's chief redraws them at the end of every
run (reporting.py); the plots tool (`python -m resnet_keras.plots MODEL_DIR`,
plots.py) at any time, a running job included. matplotlib draws with its Agg renderer (no display)
and is imported only here, so training works without it.
"""

import os
from typing import Dict, List

from common.errors import UsageError
from resnet_keras.engine import metrics
from resnet_keras.rundir import run_directory

# File name -> (title, y label, [(record key, legend label)]).
_FIGURES = {
    'loss': ('Loss (cross-entropy)', 'loss',
             [('train_loss', 'train'), ('eval_loss', 'eval')]),
    'accuracy': ('Accuracy', 'accuracy',
                 [('train_accuracy', 'train top-1'),
                  ('eval_accuracy', 'eval top-1'),
                  ('eval_top5_accuracy', 'eval top-5')]),
    'learning_rate': ('Learning rate', 'learning rate',
                      [('learning_rate', None)]),
    'examples_per_second': ('Throughput', 'images/sec',
                            [('examples_per_second', None)]),
}


def _matplotlib():
  """matplotlib's canvas and figure classes; one line where it is missing."""
  try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError('matplotlib is not installed; pip install -r '
                     'requirements.txt') from None
  return FigureCanvasAgg, Figure


def drawable_records(model_dir: str) -> List[Dict]:
  """model_dir's metrics.jsonl records; refuses, in one line, a directory
  without any, or a machine without matplotlib."""
  _matplotlib()
  records = metrics.read_metrics_log(model_dir)
  if not records:
    raise UsageError(f'{model_dir} has no {run_directory.METRICS_FILE} records '
                     'yet; it is written while a run trains')
  return records


def write_plots(model_dir: str) -> List[str]:
  """Draws model_dir/metrics.jsonl into model_dir/plots; returns the paths."""
  records = drawable_records(model_dir)
  FigureCanvasAgg, Figure = _matplotlib()  # pylint: disable=invalid-name
  out_dir = os.path.join(model_dir, run_directory.PLOTS_DIR)
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for name, (title, ylabel, series) in _FIGURES.items():
    curves = [(_curve(records, key), label) for key, label in series]
    curves = [(xy, label) for xy, label in curves if xy[0]]
    if not curves:  # E.g. no evaluation and no log line yet.
      continue
    figure = Figure(figsize=(7, 4), layout='tight')
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (steps, values), label in curves:
      # Evaluations are few: markers show where each one is.
      axes.plot(steps, values, marker='o' if len(steps) < 30 else None,
                label=label)
    axes.set(title=title, xlabel='step', ylabel=ylabel)
    axes.grid(alpha=0.3)
    if any(label for _, label in curves):
      axes.legend()
    path = os.path.join(out_dir, name + '.png')
    # Written aside and renamed: a viewer never opens half a PNG.
    figure.savefig(path + '.tmp', format='png', dpi=100)
    os.replace(path + '.tmp', path)
    paths.append(path)
  return paths


def _curve(records: List[Dict], key: str):
  points = [(r['step'], r[key]) for r in records if key in r]
  return [s for s, _ in points], [v for _, v in points]
