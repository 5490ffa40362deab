"""model_dir's checkpoints and config.json: what tools read back, and the
checkpoints they refuse."""

import dataclasses
import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from common.errors import UsageError
from resnet_keras.rundir import checkpoints
from resnet_keras.optimization import ema
from resnet_keras.training import goodput
from resnet_keras.rundir import run_directory
from tests.support import runner
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import make_training_plan

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


BACKEND = distribution.Backend(tf.distribute.get_strategy())


class _HeldAttempt(goodput.Attempt):
  """An attempt's account whose record of a background write (in the
  writer's thread, once the checkpoint's files are complete, before the
  manager names it in the state file) waits until `released`."""

  def __init__(self):
    super().__init__(None, time.time(), 0)
    self.released, self.holding = threading.Event(), threading.Event()
    self.released.set()

  def checkpoint_written(self, seconds):
    self.holding.set()
    assert self.released.wait(60)
    super().checkpoint_written(seconds)


def test_a_save_returns_before_its_write_and_the_state_file_names_it_after(
    tmp_path):
  model, optimizer = _model_and_optimizer()
  saver = checkpoints.Saver(
      checkpoints.make_manager(model, optimizer, str(tmp_path)), BACKEND)
  attempt = _HeldAttempt()
  saver.save(4, attempt)
  assert saver.wait(attempt) and not saver.wait(attempt)
  attempt.released.clear()
  attempt.holding.clear()
  saver.save(8, attempt)
  assert attempt.holding.wait(60)  # The save returned; its write goes on.
  assert checkpoints.unreadable(str(tmp_path / 'ckpt-8')) is None
  assert checkpoints.latest(str(tmp_path)) == (str(tmp_path / 'ckpt-4'), 4)
  attempt.released.set()
  assert saver.wait(attempt)
  assert checkpoints.latest(str(tmp_path)) == (str(tmp_path / 'ckpt-8'), 8)
  assert attempt.record['checkpoints'] > 0
  assert attempt.record['checkpoint_writes'] > 0


def test_a_failed_write_is_raised_by_the_wait_and_named_nowhere(tmp_path):
  model, optimizer = _model_and_optimizer()
  saver = checkpoints.Saver(
      checkpoints.make_manager(model, optimizer, str(tmp_path)), BACKEND)
  attempt = goodput.Attempt(None, time.time(), 0)
  saver.save(4, attempt)
  saver.wait(attempt)
  # A file where the write's temporary folder goes: its write fails.
  (tmp_path / 'ckpt-8_temp').write_text('')
  saver.save(8, attempt)
  with pytest.raises(tf.errors.OpError):
    saver.wait(attempt)
  assert not saver.wait(attempt)  # Raised once, not again at the exit.
  assert checkpoints.latest(str(tmp_path)) == (str(tmp_path / 'ckpt-4'), 4)


def test_a_step_saved_already_is_not_written_again(tmp_path):
  """Neither the resumed-from checkpoint (a stop before the first step) nor
  this process's last save (a stop right after it)."""
  model, optimizer = _model_and_optimizer()
  manager = checkpoints.make_manager(model, optimizer, str(tmp_path))
  saver = checkpoints.Saver(manager, BACKEND, resumed_at=4)
  attempt = goodput.Attempt(None, time.time(), 4)
  assert saver.save(4, attempt) == 0.0 and not saver.wait(attempt)
  assert manager.checkpoints == []
  saver.save(8, attempt)
  assert saver.wait(attempt)
  assert saver.save(8, attempt) == 0.0 and not saver.wait(attempt)
  assert [os.path.basename(p) for p in manager.checkpoints] == ['ckpt-8']


def _trained_with_average_and_loss_scale():
  """A model with batch norm, its optimizer (momentum slots, a dynamic loss
  scale) after a step, and the weight average after it."""
  model = tf_keras.Sequential([tf_keras.Input([4]), tf_keras.layers.Dense(3),
                               tf_keras.layers.BatchNormalization()])
  optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9))
  average = ema.EMA(model.variables, 0.5)

  def step():
    with tf.GradientTape() as tape:
      loss = optimizer.get_scaled_loss(tf.reduce_sum(
          model(tf.random.normal([8, 4]), training=True) ** 2))
    grads = optimizer.get_unscaled_gradients(
        tape.gradient(loss, model.trainable_variables))
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    average.update(optimizer.iterations)

  return model, optimizer, average, step


def test_an_async_checkpoint_holds_and_restores_what_a_sync_one_does(
    tmp_path):
  """Twice: a process's first async save copies the values eagerly as it
  sets up its copies, the later ones in a traced function."""
  model, optimizer, average, step = _trained_with_average_and_loss_scale()
  sync = checkpoints.make_manager(model, optimizer, str(tmp_path / 'sync'),
                                  ema=average)
  saver = checkpoints.Saver(checkpoints.make_manager(
      model, optimizer, str(tmp_path / 'async'), ema=average), BACKEND)
  attempt = goodput.Attempt(None, time.time(), 0)
  for number in (1, 2):
    step()
    sync.save(checkpoint_number=number)
    saver.save(number, attempt)
    saver.wait(attempt)
    # TensorFlow's own count of saves, which nothing here reads (a run's
    # checkpoints are named by their step): the async writer keeps its own.
    values = [runner.checkpoint_values(
        str(tmp_path / kind / f'ckpt-{number}'),
        lambda name: not name.startswith('save_counter'))
              for kind in ('sync', 'async')]
    assert values[0].keys() == values[1].keys()
    assert any(n.startswith('weight_average/') for n in values[0])
    assert any('loss_scale' in n for n in values[0])
    for name, value in values[0].items():
      np.testing.assert_array_equal(value, values[1][name], err_msg=name)
  restored, restored_optimizer, restored_average, _ = (
      _trained_with_average_and_loss_scale())
  checkpoints.checkpoint_of(restored, restored_optimizer,
                            restored_average).restore(
                                str(tmp_path / 'async' / 'ckpt-2')
                            ).assert_existing_objects_matched()
  for mine, theirs in zip(model.variables + average.averages,
                          restored.variables + restored_average.averages):
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
