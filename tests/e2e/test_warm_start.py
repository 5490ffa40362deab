"""--restore_from, --restore_optimizer, --pretrained_checkpoint,
--freeze_backbone from trained runs: what a warm start restores, whole runs
that continue, fine-tune and resume, and their one-line errors. (Which
combinations a config accepts: unit/.)"""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.rundir import checkpoints
from resnet_keras.optimization import lr_schedules
from resnet_keras.model import network as network_lib
from resnet_keras.optimization import optimizers
from resnet_keras.engine import start as start_lib
from resnet_keras.data import datasets
from resnet_keras.config.plan import make_training_plan
from common.errors import UsageError
from tests.support import runner
from tests.support.records import write_dataset


def _run_objects(cfg):
  """(network, model, optimizer) as run.py builds them, slots included."""
  network, model = network_lib.build_models(
      cfg, cfg.num_classes, use_regularizers=False,
      pipeline_output=datasets.pipeline_output(cfg))
  optimizer = optimizers.build_optimizer(
      cfg, lr_schedules.schedule_for_run(cfg, cfg.batch_size, 4, 8))
  optimizers.create_slots(optimizer, model.trainable_variables)
  return network, model, optimizer


def _this_run(synthetic_run, tmp_path, **changes):
  """A new run in tmp_path/new with synthetic_run's config and `changes`."""
  cfg, _ = checkpoints.read_config(synthetic_run)
  return dataclasses.replace(cfg, model_dir=str(tmp_path / 'new'), **changes)


def _source(cfg):
  """The warm start's source `cfg` decides (None: it starts otherwise), in
  a plan long enough for any restored step."""
  plan = make_training_plan(dataclasses.replace(cfg, train_steps=0), 10**6,
                            10)
  return start_lib.decide(cfg, plan).source


def test_restore_from_weights_only_or_with_the_optimizer(synthetic_run,
                                                         tmp_path):
  latest = os.path.join(synthetic_run, 'ckpt-8')
  saved = runner.model_weights(latest)
  for restore_optimizer, step in ((False, 0), (True, 8)):
    cfg = _this_run(synthetic_run, tmp_path, restore_from=synthetic_run,
                    restore_optimizer=restore_optimizer)
    source = _source(cfg)
    assert source.checkpoint == latest and source.cfg.num_classes == 10
    network, model, optimizer = _run_objects(cfg)
    start_lib.load_source(source, network, model, optimizer, restore_optimizer)
    assert int(optimizer.iterations.numpy()) == step
    restored = tf.train.Checkpoint(model=model)
    path = restored.write(str(tmp_path / 'restored'))
    for key, value in runner.model_weights(path).items():
      np.testing.assert_array_equal(value, saved[key], err_msg=key)
    slot = optimizer.get_slot(network.get_layer('fc').kernel, 'momentum')
    assert np.any(slot.numpy()) == restore_optimizer


def test_pretrained_backbone_with_a_new_head(synthetic_run, tmp_path):
  cfg = _this_run(synthetic_run, tmp_path, num_classes=3,
                  pretrained_checkpoint=os.path.join(synthetic_run, 'ckpt-4'),
                  freeze_backbone=True)
  source = _source(cfg)
  network, model, optimizer = _run_objects(cfg)
  head_before = network.get_layer('fc').get_weights()
  start_lib.load_source(source, network, model, optimizer, False)

  source_network, source_model = network_lib.build_models(
      source.cfg, 10, use_regularizers=False,
      pipeline_output=datasets.pipeline_output(source.cfg))
  tf.train.Checkpoint(model=source_model).read(
      source.checkpoint).expect_partial()
  layers = network_lib.backbone_layers(network)
  assert len(layers) == len(network_lib.backbone_layers(source_network)) > 20
  for layer in layers:
    for mine, theirs in zip(layer.get_weights(),
                            source_network.get_layer(layer.name).get_weights()):
      np.testing.assert_array_equal(mine, theirs, err_msg=layer.name)
  for now, before in zip(network.get_layer('fc').get_weights(), head_before):
    np.testing.assert_array_equal(now, before)
  assert network.output_shape == (None, 3)
  # Frozen: only the head trains, and batch norm keeps its statistics.
  assert [v.name.split('/')[-1] for v in model.trainable_variables] == [
      'kernel:0', 'bias:0']
  bn = network.get_layer('stem_bn')
  statistics = bn.moving_mean.numpy()
  model(tf.random.uniform([2, 32, 32, 3]), training=True)
  np.testing.assert_array_equal(bn.moving_mean.numpy(), statistics)


def test_sources_are_resolved_or_refused_in_one_line(synthetic_run,
                                                     records_run, tmp_path):
  def refused(message, **changes):
    with pytest.raises(UsageError, match=message):
      _source(_this_run(synthetic_run, tmp_path, **changes))

  refused(r'--restore_from=.*nope is neither a directory nor a checkpoint',
          restore_from=str(tmp_path / 'nope'))
  (tmp_path / 'empty').mkdir()
  refused('is a directory without checkpoints',
          restore_from=str(tmp_path / 'empty'))
  bare = tmp_path / 'bare'
  shutil.copytree(synthetic_run, bare)
  os.remove(bare / 'config.json')
  refused('--pretrained_checkpoint=.*config.json does not exist',
          pretrained_checkpoint=str(bare))
  # records_run has 6 classes: another model to restore, fine to transfer.
  refused(r'holds another model \(model resnet10_w0.25, .*num_classes 6, '
          r'stem imagenet; this run: model resnet10_w0.25, .*num_classes 10',
          restore_from=records_run[1])
  assert _source(_this_run(
      synthetic_run, tmp_path, pretrained_checkpoint=records_run[1]))
  refused(r'holds another model \(model resnet10_w0.25, norm batch, stem '
          r'imagenet; this run: model resnet34_w0.25',
          pretrained_checkpoint=synthetic_run, resnet_depth=34)
  # A model_dir with its own checkpoint resumes instead.
  assert _source(dataclasses.replace(
      checkpoints.read_config(records_run[1])[0],
      restore_from=str(tmp_path / 'nope'))) is None


@pytest.mark.slow
def test_restore_with_optimizer_continues_then_resumes(synthetic_run,
                                                       tmp_path):
  model_dir = tmp_path / 'continued'

  def train(epochs):
    result = runner.run_main(runner.TINY + [
        '-md', str(model_dir), '-te', str(epochs),
        '--enable_checkpoint_and_export', '--restore_from', synthetic_run,
        '--restore_optimizer'])
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr

  assert 'weights and optimizer, step 8' in train(3)
  summary = runner.read_summary(model_dir)
  assert summary['resumed_from_step'] == 8 and summary['train_steps'] == 12
  with open(model_dir / 'config.json') as f:
    assert json.load(f)['config']['restore_from'] == synthetic_run
  # One more epoch: its own ckpt-12 wins over --restore_from.
  assert '--restore_from ignored' in train(4)
  assert runner.read_summary(model_dir)['resumed_from_step'] == 12


@pytest.mark.slow
def test_frozen_fine_tune_end_to_end(synthetic_run, tmp_path):
  model_dir = tmp_path / 'frozen'
  source = os.path.join(synthetic_run, 'ckpt-8')
  args = [a for a in runner.TINY if not a.startswith('--num_classes')]
  result = runner.run_main(args + [
      '--num_classes=4', '-md', str(model_dir), '-te', '1',
      '--enable_checkpoint_and_export', '--pretrained_checkpoint', source,
      '--freeze_backbone'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'new 4-class head' in result.stderr
  before, after = (runner.model_weights(p)
                   for p in (source, str(model_dir / 'ckpt-4')))
  head = [k for k in after if after[k].shape != before[k].shape]
  assert len(head) == 2 and all(after[k].shape[-1] == 4 for k in head)
  for key in after.keys() - set(head):  # BN moving statistics included.
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_bad_flags_fail_in_one_line(synthetic_run, tmp_path):
  runner.assert_one_line_error(
      runner.run_main(runner.TINY + ['-md', str(tmp_path / 'a'),
                                     '--freeze_backbone']),
      '--freeze_backbone', '--pretrained_checkpoint')
  args = [a for a in runner.TINY if not a.startswith('--num_classes')]
  runner.assert_one_line_error(
      runner.run_main(args + ['--num_classes=5', '-md', str(tmp_path / 'b'),
                              '--restore_from', synthetic_run]),
      '--restore_from=', 'num_classes 10', 'this run: ', 'num_classes 5')


def test_a_restored_step_past_the_end_stops_with_a_fix(synthetic_run, tmp_path):
  # synthetic_run ended at step 8; these flags make an 8-step run.
  result = runner.run_main(runner.TINY + ['-md', str(tmp_path / 'new'),
                                          '-te', '2',
                                          '--restore_from', synthetic_run,
                                          '--restore_optimizer'])
  runner.assert_stopped_with(result, 'restored step 8', 'only 8 steps',
                             '--train_epochs')
  assert not os.path.exists(tmp_path / 'new' / 'ckpt-8.index')


@pytest.mark.slow
def test_a_warm_started_run_resumes_exactly(tmp_path):
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)  # 17 training records: 4 steps of 4 per epoch

  def train(model_dir, epochs, *extra):
    result = runner.run_main([
        '-dd', data_dir, '-md', str(tmp_path / model_dir),
        '--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--batch_size=4',
        f'-te={epochs}', '--steps_per_loop=2', '--log_steps=2',
        '--global_seed=7', '--enable_checkpoint_and_export', '--skip_eval',
        *extra])
    assert result.returncode == 0, result.stderr[-3000:]
    return runner.read_summary(str(tmp_path / model_dir))

  train('source', 1)                                    # ends at step 4
  warm = ['--restore_from', str(tmp_path / 'source'), '--restore_optimizer']
  straight = train('straight', 3, *warm)                # steps 4 -> 12
  # The straight run as it stood at its ckpt-8, a job stopped there: its
  # world_sizes.json says its own data began at step 4.
  runner.copy_run_up_to(str(tmp_path / 'straight'), 8,
                        str(tmp_path / 'resumed'))
  resumed = train('resumed', 3, *warm)                  # its own ckpt-8 -> 12
  assert resumed['resumed_from_step'] == 8 and resumed['train_steps'] == 12
  # The resumed run skips the 4 steps of data its first part read, not 8.
  assert resumed['weights_sha256'] == straight['weights_sha256']
