"""Where a run starts (resnet_keras/engine/start.py's decide and
check_announced), from hand-made model_dirs: a config.json and a tiny checkpoint of a few
variables under the names a run's checkpoints use, no training run."""

import dataclasses
import json

import pytest
import tensorflow as tf

from common.errors import UsageError
from resnet_keras.rundir import checkpoints
from resnet_keras.rundir import run_directory
from resnet_keras.engine import start as start_lib
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import make_training_plan

# 64 examples in batches of 8 for 2 epochs: 16 steps.
CFG = RunConfig(resnet_depth=18, num_classes=10, batch_size=8,
                train_epochs=2)
PLAN = make_training_plan(CFG, 64, 16)


def _run_dir(path, step, cfg=CFG, average=False):
  """`path` as a run left it at `step`: config.json and ckpt-<step>."""
  path.mkdir(exist_ok=True)
  checkpoints.record_config(str(path), cfg, PLAN)
  objects = {'optimizer': tf.train.Checkpoint(
      iter=tf.Variable(step, dtype=tf.int64))}
  if average:
    objects['weight_average'] = tf.train.Checkpoint(w=tf.Variable(1.0))
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(**objects), str(path), max_to_keep=None,
      checkpoint_name=run_directory.CHECKPOINT_PREFIX)
  return manager.save(checkpoint_number=step)


def _cfg(path, **changes):
  return dataclasses.replace(CFG, model_dir=str(path), **changes)


def test_an_empty_model_dir_starts_fresh(tmp_path):
  start = start_lib.decide(_cfg(tmp_path), PLAN)
  assert start == start_lib.Start(start_lib.FRESH, 0)
  assert start_lib.decide(_cfg(tmp_path / 'new', stem_init='pca'),
                          PLAN).fit_stem


def test_a_model_dir_with_a_checkpoint_resumes_from_it(tmp_path):
  prefix = _run_dir(tmp_path, 6)
  start = start_lib.decide(_cfg(tmp_path), PLAN)
  assert start == start_lib.Start(start_lib.RESUMED, 6, batches_read=6,
                                  checkpoint=prefix)
  assert start.batches_read_at(10) == 10
  # Its own checkpoint wins over a warm start asked for again.
  other = tmp_path / 'other'
  _run_dir(other, 4)
  assert start_lib.decide(_cfg(tmp_path, restore_from=str(other)),
                          PLAN).checkpoint == prefix


def test_a_resumed_run_reads_its_data_on_from_where_it_began(tmp_path):
  _run_dir(tmp_path, 6)
  # Warm-started at step 2: it has read 4 batches of its own data.
  (tmp_path / run_directory.WARM_START_FILE).write_text(json.dumps(
      {'flag': '--restore_from', 'checkpoint': '/x/ckpt-2', 'step': 2}))
  assert start_lib.decide(_cfg(tmp_path), PLAN).batches_read == 4
  # The job's shapes say it: 4 steps of 16 examples, then 2 of 8.
  (tmp_path / run_directory.WORLD_FILE).write_text(json.dumps(
      [{'step': 0, 'global_batch_size': 16}, {'step': 4,
                                              'global_batch_size': 8}]))
  assert start_lib.decide(_cfg(tmp_path), PLAN).batches_read == (
      (4 * 16 + 2 * 8) // PLAN.global_batch_size)


def test_the_weight_average_goes_on_only_from_a_checkpoint_holding_one(
    tmp_path):
  _run_dir(tmp_path / 'plain', 6)
  _run_dir(tmp_path / 'averaged', 6, average=True)
  assert not start_lib.decide(_cfg(tmp_path / 'plain', ema_decay=0.9),
                              PLAN).resumes_ema
  assert start_lib.decide(_cfg(tmp_path / 'averaged', ema_decay=0.9),
                          PLAN).resumes_ema
  assert not start_lib.decide(_cfg(tmp_path / 'averaged'),
                              PLAN).resumes_ema


def test_a_model_dir_of_another_model_is_refused(tmp_path):
  _run_dir(tmp_path, 6, cfg=dataclasses.replace(CFG, resnet_depth=50))
  with pytest.raises(UsageError, match='holds checkpoints of another model'):
    start_lib.decide(_cfg(tmp_path), PLAN)


def test_a_warm_start_takes_another_runs_checkpoint(tmp_path):
  source = tmp_path / 'source'
  prefix = _run_dir(source, 6)
  model_dir = tmp_path / 'run'
  start = start_lib.decide(_cfg(model_dir, restore_from=str(source)), PLAN)
  assert (start.kind, start.step, start.checkpoint) == (start_lib.WARM, 0,
                                                        prefix)
  assert start.source.flag == start_lib.RESTORE_FLAG
  assert start.source.cfg.model_dir == str(source)
  # --restore_optimizer goes on from the optimizer's step.
  start = start_lib.decide(_cfg(model_dir, restore_from=prefix,
                                restore_optimizer=True), PLAN)
  assert (start.step, start.batches_read) == (6, 0)
  # Another number of classes: the backbone only.
  start = start_lib.decide(_cfg(model_dir, num_classes=5,
                                pretrained_checkpoint=str(source)), PLAN)
  assert start.source.flag == start_lib.PRETRAINED_FLAG
  with pytest.raises(UsageError, match='holds another model'):
    start_lib.decide(_cfg(model_dir, num_classes=5, restore_from=prefix),
                     PLAN)


def test_a_restored_step_past_the_plan_is_refused(tmp_path):
  source = tmp_path / 'source'
  _run_dir(source, PLAN.total_train_steps)
  with pytest.raises(UsageError, match='it would train nothing'):
    start_lib.decide(_cfg(tmp_path / 'run', restore_from=str(source),
                          restore_optimizer=True), PLAN)


def test_a_restart_must_find_the_checkpoint_the_launcher_announced(tmp_path):
  resumed = start_lib.Start(start_lib.RESUMED, 6)
  fresh = start_lib.Start(start_lib.FRESH, 0)
  warm = start_lib.Start(start_lib.WARM, 4)
  for start, announced in ((resumed, None), (resumed, 6), (fresh, 0),
                           (warm, 0), (fresh, None)):
    start_lib.check_announced(start, announced, str(tmp_path))
  with pytest.raises(UsageError, match='its checkpoint at step 6 in'):
    start_lib.check_announced(resumed, 8, str(tmp_path))
  with pytest.raises(UsageError, match='finds no checkpoint in'):
    start_lib.check_announced(fresh, 8, str(tmp_path))
  with pytest.raises(UsageError, match='finds no checkpoint in'):
    start_lib.check_announced(warm, 4, str(tmp_path))
