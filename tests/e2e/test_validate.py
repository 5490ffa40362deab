"""python -m resnet_keras.validate on trained runs: their checkpoints, scored
as they scored them, and its one-line errors."""

import csv
import json
import os
import shutil

import pytest

from resnet_keras.rundir import checkpoints
from resnet_keras.engine import metrics
from tests.support import runner


def _validate(model_dir, *args, **kwargs):
  return runner.run_tool('resnet_keras.validate',
                         ['--model_dir', model_dir] + list(args), **kwargs)


def _csv_rows(model_dir):
  with open(os.path.join(model_dir, 'validation.csv')) as f:
    return list(csv.DictReader(f))


def test_every_checkpoint_scores_what_training_evaluated(synthetic_run):
  result = _validate(synthetic_run, '--checkpoint', 'all')
  assert result.returncode == 0, result.stderr[-3000:]
  table = result.stdout.splitlines()
  assert table[0].split() == ['checkpoint', 'step', 'epoch', 'top-1', 'top-5',
                              'loss']
  assert [l.split()[:3] for l in table[1:3]] == [['ckpt-4', '4', '1.00'],
                                                 ['ckpt-8', '8', '2.00']]
  rows = _csv_rows(synthetic_run)
  evals = [r for r in metrics.read_metrics_log(synthetic_run)
           if 'eval_loss' in r]
  assert [int(r['step']) for r in rows] == [e['step'] for e in evals] == [4, 8]
  for row, logged in zip(rows, evals):
    assert int(row['examples']) == logged['eval_examples'] == 13
    assert float(row['top1']) == pytest.approx(logged['eval_accuracy'])
    assert float(row['top5']) == pytest.approx(logged['eval_top5_accuracy'])
    assert float(row['loss']) == pytest.approx(logged['eval_loss'], rel=1e-5)


def test_eval_flip_scores_each_image_with_its_mirror(synthetic_run):
  result = _validate(synthetic_run, '--checkpoint', 'ckpt-8', '--eval_flip')
  assert result.returncode == 0, result.stderr[-3000:]
  (row,) = _csv_rows(synthetic_run)
  logged = [r for r in metrics.read_metrics_log(synthetic_run)
            if 'eval_loss' in r][-1]
  assert int(row['examples']) == 13  # Each image once, not twice.
  # Other predictions than the run's own (unflipped) evaluation.
  assert float(row['loss']) != pytest.approx(logged['eval_loss'], rel=1e-5)


def test_latest_checkpoint_of_a_records_run_and_other_data(records_run,
                                                            tmp_path):
  data_dir, model_dir = records_run
  cfg, plan = checkpoints.read_config(model_dir)
  assert cfg.num_classes == 6                 # resolved from the data
  assert plan.steps_per_epoch == 4 and plan.global_batch_size == 4
  result = _validate(model_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  (row,) = _csv_rows(model_dir)
  summary = runner.read_summary(model_dir)
  assert row['checkpoint'] == 'ckpt-8' and int(row['examples']) == 9
  assert float(row['top1']) == pytest.approx(summary['eval_accuracy'])
  assert float(row['loss']) == pytest.approx(summary['eval_loss'], rel=1e-5)

  # A copy without the second validation shard (4 of the 9 images).
  other = tmp_path / 'other'
  shutil.copytree(data_dir, other)
  os.remove(other / 'validation' / 'validation-00001-of-00002')
  result = _validate(model_dir, '--data_dir', str(other))
  assert result.returncode == 0, result.stderr[-3000:]
  assert int(_csv_rows(model_dir)[0]['examples']) == 5


def test_bad_inputs_fail_in_one_line(synthetic_run, records_run, tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  runner.assert_one_line_error(_validate(str(empty)), 'config.json does not '
                               'exist')
  runner.assert_one_line_error(_validate(str(tmp_path / 'nope')),
                               'is not a directory')
  # A run that kept no checkpoints.
  shutil.copy(os.path.join(synthetic_run, 'config.json'), empty)
  runner.assert_one_line_error(_validate(str(empty)), 'has no checkpoints',
                               '--enable_checkpoint_and_export')
  runner.assert_one_line_error(
      _validate(synthetic_run, '--checkpoint', 'ckpt-5'),
      '--checkpoint=ckpt-5', 'ckpt-4, ckpt-8')
  # records_run's checkpoints have 6 classes, synthetic_run's model 10.
  other = os.path.join(records_run[1], 'ckpt-4')
  runner.assert_one_line_error(_validate(synthetic_run, '--checkpoint', other),
                               'is not a checkpoint of this run\'s model',
                               'num_classes 10')
  runner.assert_one_line_error(
      _validate(records_run[1], '--data_dir', str(tmp_path / 'nodata')),
      '--data_dir=', 'does not exist')


def test_unreadable_config_names_the_file(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps({'config': {}}))
  runner.assert_one_line_error(_validate(str(tmp_path)), 'config.json is '
                               'unreadable', 'delete it')
