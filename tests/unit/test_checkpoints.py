"""model_dir's checkpoints and config.json: what tools read back, and the
checkpoints they refuse."""

import dataclasses
import os

import pytest
import tensorflow as tf
import tf_keras

from common.errors import UsageError
from resnet_keras import checkpoints
from resnet_keras import run_directory
from resnet_keras.config import RunConfig
from resnet_keras.plan import make_training_plan

CFG = RunConfig(resnet_depth=18, num_classes=10, batch_size=8)
PLAN = make_training_plan(CFG, 64, 16)


def _model_and_optimizer(units=10):
  model = tf_keras.Sequential([tf_keras.Input([4]),
                               tf_keras.layers.Dense(units)])
  return model, tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)


def _saved(model_dir, steps=(4, 8), units=10):
  model, optimizer = _model_and_optimizer(units)
  manager = checkpoints.make_manager(model, optimizer, str(model_dir))
  for step in steps:
    optimizer.iterations.assign(step)
    manager.save(checkpoint_number=step)
  return manager


def test_config_json_gives_back_the_config_and_plan_where_the_run_is_now(
    tmp_path):
  checkpoints.record_config(str(tmp_path), CFG, PLAN, {'dtype': 'fp32'})
  moved = tmp_path.rename(tmp_path.parent / 'moved')
  cfg, plan = checkpoints.read_config(str(moved))
  assert cfg == dataclasses.replace(CFG, model_dir=str(moved))
  assert plan == PLAN


@pytest.mark.parametrize('text,fragment', [
    (None, 'is not a directory a training run wrote'),
    ('{"config": {', 'is unreadable')])
def test_a_missing_or_broken_config_json_is_a_usage_error(tmp_path, text,
                                                          fragment):
  if text is not None:
    (tmp_path / run_directory.CONFIG_FILE).write_text(text)
  with pytest.raises(UsageError, match=fragment):
    checkpoints.read_config(str(tmp_path))


def test_checkpoints_are_named_by_step(tmp_path):
  assert checkpoints.latest(str(tmp_path / 'none'))[1] == 0
  _saved(tmp_path)
  assert checkpoints.latest(str(tmp_path))[1] == 8


def test_checkpoint_names_become_paths(tmp_path):
  manager = _saved(tmp_path)
  latest = str(tmp_path / 'ckpt-8')
  assert checkpoints.checkpoint_paths(manager, str(tmp_path), None) == [latest]
  assert checkpoints.checkpoint_paths(manager, str(tmp_path), 'all') == [
      str(tmp_path / 'ckpt-4'), latest]
  assert checkpoints.checkpoint_paths(manager, str(tmp_path), 'ckpt-4') == [
      str(tmp_path / 'ckpt-4')]
  with pytest.raises(UsageError, match='has: ckpt-4, ckpt-8'):
    checkpoints.checkpoint_paths(manager, str(tmp_path), 'ckpt-5')


def test_no_checkpoints_is_a_usage_error(tmp_path):
  manager = _saved(tmp_path, steps=())
  with pytest.raises(UsageError, match='--enable_checkpoint_and_export'):
    checkpoints.checkpoint_paths(manager, str(tmp_path), None)


def test_a_model_dir_of_another_model_is_refused(tmp_path):
  checkpoints.check_resumable(str(tmp_path), CFG)  # Empty: anything goes.
  _saved(tmp_path)
  checkpoints.record_config(str(tmp_path), CFG, PLAN)
  checkpoints.check_resumable(str(tmp_path), CFG)
  with pytest.raises(UsageError, match='holds checkpoints of another model'):
    checkpoints.check_resumable(str(tmp_path),
                                dataclasses.replace(CFG, resnet_depth=50))
  # BlurPool's network has the same weights but computes another function.
  with pytest.raises(UsageError, match='this run: blurpool True'):
    checkpoints.check_resumable(str(tmp_path),
                                dataclasses.replace(CFG, blurpool=True))
  # Options that only change how it trains or evaluates resume.
  checkpoints.check_resumable(str(tmp_path), dataclasses.replace(
      CFG, ema_decay=0.9, zero_init_residual=True, eval_image_size=48,
      progressive_resize_start_size=32))


def test_restore_fills_every_variable_or_refuses(tmp_path):
  _saved(tmp_path)
  model, optimizer = _model_and_optimizer()
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  checkpoints.restore(checkpoint, str(tmp_path / 'ckpt-8'), CFG)
  assert int(optimizer.iterations.numpy()) == 8
  other, _ = _model_and_optimizer(units=3)
  with pytest.raises(UsageError, match='is not a checkpoint of this run'):
    checkpoints.restore(tf.train.Checkpoint(model=other),
                        str(tmp_path / 'ckpt-8'), CFG)
  tf.get_logger().setLevel('WARNING')  # restore quietened it on failure.


def test_a_manager_keeps_the_configured_number(tmp_path):
  model, optimizer = _model_and_optimizer()
  manager = checkpoints.make_manager(model, optimizer, str(tmp_path),
                                     max_to_keep=2)
  for step in (1, 2, 3):
    manager.save(checkpoint_number=step)
  assert [os.path.basename(p) for p in manager.checkpoints] == [
      'ckpt-2', 'ckpt-3']
  assert checkpoints.MAX_TO_KEEP == RunConfig().max_checkpoints
