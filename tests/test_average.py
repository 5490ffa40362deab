"""python -m resnet_keras.average: mean/EMA of a run's last checkpoints."""

import csv
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras import checkpoint_average
from resnet_keras import checkpoints
from common.errors import UsageError
from tests import e2e


def _average(model_dir, *args, **kwargs):
  return e2e.run_tool('resnet_keras.average',
                      ['--model_dir', model_dir] + list(args), **kwargs)


def _model_values(path):
  """The model's variables in a checkpoint (no optimizer slots), by key."""
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith('model/') and 'OPTIMIZER_SLOT' not in k}


def _files(directory):
  """Name -> bytes of the files directly in `directory`."""
  out = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      with open(path, 'rb') as f:
        out[name] = f.read()
  return out


def test_mean_and_ema_of_weight_lists():
  sets = [[np.array([0., 4.]), np.array(2.)], [np.array([2., 0.]),
                                               np.array(4.)],
          [np.array([4., 2.]), np.array(0.)]]
  mean = checkpoint_average.average_weights(iter(sets))
  np.testing.assert_allclose(mean[0], [2., 2.])
  np.testing.assert_allclose(mean[1], 2.)
  # EMA 0.5, oldest first: 0 -> 0.5*0+0.5*2 = 1 -> 0.5*1+0.5*4 = 2.5.
  ema = checkpoint_average.average_weights(iter(sets), ema_decay=0.5)
  np.testing.assert_allclose(ema[0], [2.5, 2.])
  np.testing.assert_allclose(ema[1], 1.5)
  assert checkpoint_average.average_weights([sets[0]])[0].tolist() == [0., 4.]


def test_selection_and_decay_checks():
  kept = ['/d/ckpt-4', '/d/ckpt-8', '/d/ckpt-12']
  assert checkpoint_average.select_last(kept, None, '/d') == kept
  assert checkpoint_average.select_last(kept, 2, '/d') == kept[1:]
  with pytest.raises(UsageError, match=r'--last=4: /d keeps 3 checkpoints '
                     r'\(ckpt-4, ckpt-8, ckpt-12\); use 1 to 3'):
    checkpoint_average.select_last(kept, 4, '/d')
  with pytest.raises(UsageError, match='--last=0'):
    checkpoint_average.select_last(kept, 0, '/d')
  for decay in (0.0, 1.0, 1.5, -0.1):
    with pytest.raises(UsageError, match='--ema=.* fraction in'):
      checkpoint_average.check_ema_decay(decay)
  checkpoint_average.check_ema_decay(0.9)
  checkpoint_average.check_ema_decay(None)
  with pytest.raises(UsageError, match='is the run\'s model_dir'):
    checkpoint_average.output_dir_for('/d', '/d/')
  assert checkpoint_average.output_dir_for('/d', None) == '/d/averaged'


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
  sources = [_model_values(os.path.join(synthetic_run, n))
             for n in ('ckpt-4', 'ckpt-8')]
  values = _model_values(averaged)
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
  summary = e2e.read_summary(synthetic_run)
  assert float(last['top1']) == pytest.approx(summary['eval_accuracy'])
  result = e2e.run_tool('resnet_keras.validate', ['--model_dir', str(output)])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[1].split()[:2] == ['ckpt-8', '8']
  assert float(result.stdout.splitlines()[1].split()[-1]) == pytest.approx(
      float(avg['loss']), rel=1e-4)


def test_ema_goes_to_model_dir_averaged(synthetic_run):
  output = os.path.join(synthetic_run, checkpoint_average.OUTPUT_DIR)
  result = _average(synthetic_run, '--ema', '0.25')
  assert result.returncode == 0, result.stderr[-3000:]
  first, last = (_model_values(os.path.join(synthetic_run, n))
                 for n in ('ckpt-4', 'ckpt-8'))
  for key, value in _model_values(os.path.join(output, 'ckpt-8')).items():
    np.testing.assert_allclose(value, 0.25 * first[key] + 0.75 * last[key],
                               rtol=1e-6, atol=1e-7, err_msg=key)
  assert 'averaged/ckpt-8' in result.stdout
  assert tf.train.latest_checkpoint(synthetic_run).endswith('ckpt-8')


@pytest.mark.processes
def test_help_lists_the_flags():
  result = e2e.spawn_tool('resnet_keras.average',
                          ['--model_dir', 'unused', '--help'], timeout=120)
  assert result.returncode == 0
  for flag in ('--model_dir', '--last', '--ema', '--output_dir', '--export'):
    assert flag in result.stdout


def test_bad_inputs_fail_in_one_line(synthetic_run, tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  e2e.assert_one_line_error(_average(str(empty)), 'config.json does not exist')
  shutil.copy(os.path.join(synthetic_run, 'config.json'), empty)
  e2e.assert_one_line_error(_average(str(empty)), 'has no checkpoints')
  e2e.assert_one_line_error(_average(synthetic_run, '--last', '3'),
                            '--last=3', 'keeps 2 checkpoints')
  e2e.assert_one_line_error(_average(synthetic_run, '--ema', '1'),
                            '--ema=1.0', '(0, 1)')
  e2e.assert_one_line_error(
      _average(synthetic_run, '--output_dir', synthetic_run), 'model_dir')
