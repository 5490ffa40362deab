"""python -m resnet_keras.average on a trained run: the mean or EMA of its
last checkpoints, scored and exported, and its one-line errors."""

import csv
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.tools import checkpoint_average
from resnet_keras.rundir import checkpoints
from tests.support import runner


def _average(model_dir, *args, **kwargs):
  return runner.run_tool('resnet_keras.average',
                         ['--model_dir', model_dir] + list(args), **kwargs)


def _files(directory):
  """Name -> bytes of the files directly in `directory`."""
  out = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      with open(path, 'rb') as f:
        out[name] = f.read()
  return out


@pytest.mark.slow
def test_mean_of_the_last_two_is_a_separate_scored_exportable_run(
    synthetic_run, tmp_path):
  before = _files(synthetic_run)
  output = tmp_path / 'avg'
  result = _average(synthetic_run, '--last', '2', '--export',
                    '--output_dir', str(output))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'mean of 2 (ckpt-4, ckpt-8)' in result.stdout
  # The run itself is untouched: training there still resumes at ckpt-8.
  assert _files(synthetic_run) == before
  assert tf.train.latest_checkpoint(synthetic_run).endswith('ckpt-8')

  averaged = str(output / 'ckpt-8')
  assert tf.train.latest_checkpoint(str(output)) == averaged
  sources = [runner.model_weights(os.path.join(synthetic_run, n))
             for n in ('ckpt-4', 'ckpt-8')]
  values = runner.model_weights(averaged)
  assert values.keys() == sources[0].keys()
  assert any('moving_mean' in k for k in values)  # BN statistics too.
  for key, value in values.items():
    np.testing.assert_allclose(value, (sources[0][key] + sources[1][key]) / 2,
                               rtol=1e-6, atol=1e-7, err_msg=key)
  cfg, _ = checkpoints.read_config(str(output))
  assert cfg.model_dir == str(output) and cfg.num_classes == 10
  record = json.loads((output / 'averaging.json').read_text())
  assert record['method'] == 'mean' and len(record['sources']) == 2
  assert (output / 'saved_model' / 'saved_model.pb').exists()

  # The table: the last checkpoint, then the average; validate agrees.
  with open(output / 'validation.csv') as f:
    last, avg = list(csv.DictReader(f))
  assert last['checkpoint'] == 'ckpt-8' and avg['step'] == '8'
  assert float(avg['loss']) != float(last['loss'])
  summary = runner.read_summary(synthetic_run)
  assert float(last['top1']) == pytest.approx(summary['eval_accuracy'])
  result = runner.run_tool('resnet_keras.validate',
                           ['--model_dir', str(output)])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[1].split()[:2] == ['ckpt-8', '8']
  assert float(result.stdout.splitlines()[1].split()[-1]) == pytest.approx(
      float(avg['loss']), rel=1e-4)


def test_ema_goes_to_model_dir_averaged(synthetic_run):
  output = os.path.join(synthetic_run, checkpoint_average.OUTPUT_DIR)
  result = _average(synthetic_run, '--ema', '0.25')
  assert result.returncode == 0, result.stderr[-3000:]
  first, last = (runner.model_weights(os.path.join(synthetic_run, n))
                 for n in ('ckpt-4', 'ckpt-8'))
  merged = runner.model_weights(os.path.join(output, 'ckpt-8'))
  for key, value in merged.items():
    np.testing.assert_allclose(value, 0.25 * first[key] + 0.75 * last[key],
                               rtol=1e-6, atol=1e-7, err_msg=key)
  assert 'averaged/ckpt-8' in result.stdout
  assert tf.train.latest_checkpoint(synthetic_run).endswith('ckpt-8')


def test_bad_inputs_fail_in_one_line(synthetic_run, tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  runner.assert_one_line_error(_average(str(empty)),
                               'config.json does not exist')
  shutil.copy(os.path.join(synthetic_run, 'config.json'), empty)
  runner.assert_one_line_error(_average(str(empty)), 'has no checkpoints')
  runner.assert_one_line_error(_average(synthetic_run, '--last', '3'),
                               '--last=3', 'keeps 2 checkpoints')
  runner.assert_one_line_error(_average(synthetic_run, '--ema', '1'),
                               '--ema=1.0', '(0, 1)')
  runner.assert_one_line_error(
      _average(synthetic_run, '--output_dir', synthetic_run), 'model_dir')
