"""metrics.jsonl from a real run, and its plots: at the end of a run and on demand."""

import contextlib
import json
import os
import shutil
import sys

import pytest

from resnet_keras import metrics
from resnet_keras import charts
from tests import e2e

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
FIGURES = ('loss', 'accuracy', 'learning_rate', 'examples_per_second')


def _is_png(path):
  with open(path, 'rb') as f:
    return f.read(8) == PNG_MAGIC


@contextlib.contextmanager
def _without_matplotlib():
  """`import matplotlib` (or any module of it) fails, as if not installed."""
  with pytest.MonkeyPatch.context() as patch:
    for name in ['matplotlib'] + [n for n in sys.modules
                                  if n.startswith('matplotlib.')]:
      patch.setitem(sys.modules, name, None)
    yield


def test_a_run_logs_every_log_line_and_eval_and_plots_them(synthetic_run):
  records = metrics.read_metrics_log(synthetic_run)
  train = [r for r in records if 'train_loss' in r]
  evals = [r for r in records if 'eval_loss' in r]
  assert [r['step'] for r in train] == [2, 4, 6, 8]   # --log_steps=2
  assert [r['epoch'] for r in train] == [0.5, 1.0, 1.5, 2.0]
  for r in train:
    assert set(r) == {'step', 'epoch', 'train_loss', 'train_accuracy',
                      'learning_rate', 'examples_per_second'}
    assert r['examples_per_second'] > 0 and r['learning_rate'] > 0
  summary = e2e.read_summary(synthetic_run)
  assert [r['step'] for r in evals] == [4, 8]
  assert evals[-1]['eval_accuracy'] == summary['eval_accuracy']
  assert evals[-1]['eval_top5_accuracy'] == summary['eval_top5_accuracy']
  assert evals[-1]['eval_loss'] == summary['eval_loss']
  assert evals[-1]['eval_examples'] == 13
  for name in FIGURES:   # drawn by the run itself
    assert _is_png(os.path.join(synthetic_run, 'plots', name + '.png'))


def test_plots_command_draws_a_metrics_log(synthetic_run, tmp_path):
  shutil.copy(os.path.join(synthetic_run, 'metrics.jsonl'), tmp_path)
  result = e2e.run_tool('resnet_keras.plots', [str(tmp_path)])
  assert result.returncode == 0, result.stderr
  expected = [str(tmp_path / 'plots' / (n + '.png')) for n in FIGURES]
  assert result.stdout.split() == expected
  assert all(_is_png(p) for p in expected)


def test_write_plots_without_evaluations(tmp_path):
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    for step in (10, 20):
      f.write(json.dumps({'step': step, 'epoch': step / 20, 'train_loss': 2.0,
                          'train_accuracy': 0.1, 'learning_rate': 0.1,
                          'examples_per_second': 50.0}) + '\n')
  paths = charts.write_plots(str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [n + '.png' for n in FIGURES]
  assert all(_is_png(p) for p in paths)
  assert not [n for n in os.listdir(tmp_path / 'plots') if n.endswith('.tmp')]


def test_plots_command_errors_in_one_line(tmp_path, synthetic_run):
  e2e.assert_one_line_error(
      e2e.run_tool('resnet_keras.plots', [str(tmp_path)]),
      'no metrics.jsonl records')
  e2e.assert_one_line_error(
      e2e.run_tool('resnet_keras.plots', [str(tmp_path / 'nope')]),
      'is not a directory')
  e2e.assert_one_line_error(e2e.run_tool('resnet_keras.plots', []), 'usage:')
  with _without_matplotlib():
    e2e.assert_one_line_error(
        e2e.run_tool('resnet_keras.plots', [synthetic_run]),
        'matplotlib is not installed')


def test_training_without_matplotlib_warns_and_succeeds(tmp_path):
  model_dir = tmp_path / 'model'
  with _without_matplotlib():
    result = e2e.run_main(e2e.TINY + ['-md', str(model_dir),
                                      '--train_steps=2', '--skip_eval'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'plots not written (matplotlib is not installed' in result.stderr
  assert len(metrics.read_metrics_log(str(model_dir))) == 1
  assert not (model_dir / 'plots').exists()
