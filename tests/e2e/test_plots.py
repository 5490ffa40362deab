"""metrics.jsonl from a real run, and its plots: at the end of a run and on
demand (python -m resnet_keras.plots), with and without matplotlib."""

import contextlib
import os
import shutil
import sys

import pytest

from resnet_keras.engine import metrics
from tests.support import runner
from tests.support.images import FIGURES, is_png


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
  summary = runner.read_summary(synthetic_run)
  assert [r['step'] for r in evals] == [4, 8]
  assert evals[-1]['eval_accuracy'] == summary['eval_accuracy']
  assert evals[-1]['eval_top5_accuracy'] == summary['eval_top5_accuracy']
  assert evals[-1]['eval_loss'] == summary['eval_loss']
  assert evals[-1]['eval_examples'] == 13
  for name in FIGURES:   # drawn by the run itself
    assert is_png(os.path.join(synthetic_run, 'plots', name + '.png'))


def test_plots_command_draws_a_metrics_log(synthetic_run, tmp_path):
  # A run's directory (config.json says so): the tool writes into runs only.
  for name in ('metrics.jsonl', 'config.json'):
    shutil.copy(os.path.join(synthetic_run, name), tmp_path)
  result = runner.run_tool('resnet_keras.plots', [str(tmp_path)])
  assert result.returncode == 0, result.stderr
  expected = [str(tmp_path / 'plots' / (n + '.png')) for n in FIGURES]
  assert result.stdout.split() == expected
  assert all(is_png(p) for p in expected)


def test_plots_command_errors_in_one_line(tmp_path, synthetic_run):
  runner.assert_one_line_error(
      runner.run_tool('resnet_keras.plots', [str(tmp_path)]),
      'no metrics.jsonl records')
  runner.assert_one_line_error(
      runner.run_tool('resnet_keras.plots', [str(tmp_path / 'nope')]),
      'is not a directory')
  runner.assert_one_line_error(runner.run_tool('resnet_keras.plots', []),
                               'usage:')
  with _without_matplotlib():
    runner.assert_one_line_error(
        runner.run_tool('resnet_keras.plots', [synthetic_run]),
        'matplotlib is not installed')


def test_training_without_matplotlib_warns_and_succeeds(tmp_path):
  model_dir = tmp_path / 'model'
  with _without_matplotlib():
    result = runner.run_main(runner.TINY + ['-md', str(model_dir),
                                            '--train_steps=2', '--skip_eval',
                                            '--plots'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'plots not written (matplotlib is not installed' in result.stderr
  assert len(metrics.read_metrics_log(str(model_dir))) == 1
  assert not (model_dir / 'plots').exists()


def test_noplots_leaves_the_metrics_log_undrawn(tmp_path):
  model_dir = tmp_path / 'model'
  result = runner.run_main(runner.TINY + ['-md', str(model_dir),
                                          '--train_steps=2', '--skip_eval',
                                          '--noplots'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(metrics.read_metrics_log(str(model_dir))) == 1
  assert not (model_dir / 'plots').exists()
  assert 'plots' not in result.stderr
