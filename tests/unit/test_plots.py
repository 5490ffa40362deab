"""The plots of a metrics log (resnet_keras/training/curves.py), written
without a run. (A real run's metrics.jsonl and plots, and the plots tool: e2e/.)"""

import json
import os

from resnet_keras.training import curves
from tests.support.images import FIGURES, is_png


def test_write_plots_without_evaluations(tmp_path):
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    for step in (10, 20):
      f.write(json.dumps({'step': step, 'epoch': step / 20, 'train_loss': 2.0,
                          'train_accuracy': 0.1, 'learning_rate': 0.1,
                          'examples_per_second': 50.0}) + '\n')
  paths = curves.write_plots(str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [n + '.png' for n in FIGURES]
  assert all(is_png(p) for p in paths)
  assert not [n for n in os.listdir(tmp_path / 'plots') if n.endswith('.tmp')]
