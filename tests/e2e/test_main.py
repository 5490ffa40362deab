"""End-to-end runs of resnet_ctl_imagenet_main.py in this process, through
its main (support/runner.py): precisions, optimizers, normalisations,
kernels, loaders, early stopping, resumes, one-line errors. (XLA, whose
C++ log needs a process of its own: processes/; --helpfull, as a fresh
interpreter prints it: unit/test_flag_surface.py.)"""

import dataclasses
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.engine import metrics
from resnet_keras.config import RunConfig
from tests.support import runner


def _steps_logged(output):
  return [l for l in output.splitlines() if '| loss ' in l and 'step ' in l]


@pytest.mark.slow
def test_fp32_sgd_train_eval_checkpoint_export_and_resume(tmp_path):
  model_dir = str(tmp_path / 'run')
  first = runner.run_main(runner.TINY + ['-md', model_dir, '-te', '2',
                                         '--enable_checkpoint_and_export',
                                         '--enable_tensorboard'])
  assert first.returncode == 0, first.stderr
  log = first.stderr
  # One line per log_steps (2) across 8 steps, each with the required fields.
  lines = _steps_logged(log)
  assert len(lines) == 4, log
  for field in ('loss', 'accuracy', 'lr', 'examples/sec', 'epoch'):
    assert field in lines[0]
  summary = runner.read_summary(model_dir)
  assert summary['train_steps'] == 8
  assert summary['global_batch_size'] == 8
  assert summary['eval_examples'] == 13       # the partial batch counts
  assert summary['dtype'] == 'fp32' and summary['optimizer'] == 'SGD'
  for key in ('train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy',
              'avg_exp_per_second'):
    assert np.isfinite(summary[key]), key
  assert summary['avg_exp_per_second'] > 0
  assert log.count('eval at step') == 2        # every epoch
  assert os.path.exists(os.path.join(model_dir, 'ckpt-4.index'))
  assert os.path.exists(os.path.join(model_dir, 'ckpt-8.index'))
  # The effective config, for tools: every field, the class count resolved.
  with open(os.path.join(model_dir, 'config.json')) as f:
    recorded = json.load(f)
  assert set(recorded['config']) == {
      f.name for f in dataclasses.fields(RunConfig)}
  assert recorded['config']['resnet_depth'] == 10
  assert recorded['config']['num_classes'] == 10
  assert recorded['training_plan']['steps_per_epoch'] == 4
  assert glob.glob(os.path.join(model_dir, 'train', 'events.out.tfevents.*'))
  assert glob.glob(os.path.join(model_dir, 'eval', 'events.out.tfevents.*'))

  loaded = tf.saved_model.load(os.path.join(model_dir, 'saved_model'))
  pixels = np.random.RandomState(0).randint(0, 256, [3, 32, 32, 3])
  probs_u8 = loaded.signatures['serving_uint8'](
      images=tf.constant(pixels, tf.uint8))['probabilities'].numpy()
  probs_f = loaded.signatures['serving_default'](
      images=tf.constant(pixels, tf.float32))['probabilities'].numpy()
  assert probs_u8.shape == (3, 10)
  np.testing.assert_allclose(probs_u8.sum(axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(probs_u8, probs_f, rtol=1e-5, atol=1e-6)

  second = runner.run_main(runner.TINY + ['-md', model_dir, '-te', '3',
                                          '--enable_checkpoint_and_export'])
  assert second.returncode == 0, second.stderr
  assert 'ckpt-8 at step 8' in second.stderr
  assert len(_steps_logged(second.stderr)) == 2   # only the new epoch
  summary = runner.read_summary(model_dir)
  assert summary['train_steps'] == 12 and summary['resumed_from_step'] == 8
  assert os.path.exists(os.path.join(model_dir, 'ckpt-12.index'))
  # The metrics log goes on where the first run left it.
  steps = [(r['step'], 'eval_loss' in r)
           for r in metrics.read_metrics_log(model_dir)]
  assert steps == [(2, False), (4, False), (4, True), (6, False), (8, False),
                   (8, True), (10, False), (12, False), (12, True)]


@pytest.mark.slow
def test_bf16_lars_reference_preset(tmp_path):
  model_dir = str(tmp_path / 'lars')
  result = runner.run_main(runner.TINY + [
      '-md', model_dir, '-dt', 'bf16', '--optimizer', 'LARS',
      '--base_learning_rate', '2.5', '--warmup_epochs', '1', '--lr_schedule',
      'polynomial', '--label_smoothing', '0.1', '--weight_decay', '0.0001',
      '--single_l2_loss_op', '-te', '2', '--skip_eval'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['dtype'] == 'bf16' and summary['optimizer'] == 'LARS'
  assert np.isfinite(summary['train_loss'])
  assert summary['eval_examples'] == 0
  assert 'eval at step' not in result.stderr
  assert 'weight decay is applied inside the optimizer' in result.stderr
  # Peak LR 2.5 at the end of the 1-epoch (4-step) warmup.
  assert 'step 4/8 | epoch 1.00' in result.stderr
  assert '| lr 2.5 |' in result.stderr


@pytest.mark.slow
def test_fp16_logs_and_records_its_loss_scale(tmp_path):
  """The GPU precision end to end (slow but exact on a CPU): dynamic loss
  scaling, its scale on every log line and in metrics.jsonl, a checkpoint
  and an export in float32 out."""
  model_dir = str(tmp_path / 'fp16')
  result = runner.run_main(runner.TINY + ['-md', model_dir, '-dt', 'fp16',
                                          '--enable_checkpoint_and_export'])
  assert result.returncode == 0, result.stderr[-3000:]
  lines = _steps_logged(result.stderr)
  assert len(lines) == 2 and all('| loss scale ' in l for l in lines)
  records = [r for r in metrics.read_metrics_log(model_dir)
             if 'train_loss' in r]
  assert [r['step'] for r in records] == [2, 4]
  # 2^15 to start, halved on overflows, doubled after 2000 good steps only.
  assert all(0 < r['loss_scale'] <= 2 ** 15 for r in records)
  assert f'loss scale {records[-1]["loss_scale"]:g} |' in lines[-1]
  summary = runner.read_summary(model_dir)
  assert summary['dtype'] == 'fp16' and np.isfinite(summary['train_loss'])
  assert summary['eval_examples'] == 13
  loaded = tf.saved_model.load(os.path.join(model_dir, 'saved_model'))
  probs = loaded(tf.zeros([1, 32, 32, 3]), training=False)
  assert probs.dtype == tf.float32
  np.testing.assert_allclose(np.sum(probs), 1.0, rtol=1e-3)


@pytest.mark.slow
def test_group_norm_rmsprop_stepped_bf16_and_norm_in_checkpoint_identity(
    tmp_path):
  model_dir = str(tmp_path / 'group')
  result = runner.run_main(runner.TINY + [
      '-md', model_dir, '-dt', 'bf16', '--norm', 'group', '--groups', '16',
      '--optimizer', 'RMSProp', '--base_learning_rate', '0.01',
      '--warmup_epochs', '0', '--lr_schedule', 'stepped',
      '--lr_decay_points', '0.5', '--lr_decay_factor', '0.1', '-te', '2',
      '--enable_checkpoint_and_export'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['optimizer'] == 'RMSProp' and summary['train_steps'] == 8
  assert np.isfinite(summary['train_loss']) and summary['eval_examples'] == 13
  # Peak 0.01 x 8/256 until half of the 8 steps, then x0.1.
  assert '| lr 0.0003125 |' in result.stderr
  assert '| lr 3.125e-05 |' in result.stderr
  assert os.path.isdir(os.path.join(model_dir, 'saved_model'))
  with open(os.path.join(model_dir, 'config.json')) as f:
    assert json.load(f)['config']['lr_decay_points'] == [0.5]
  batch_norm = runner.run_main(runner.TINY + ['-md', model_dir, '-te', '3'])
  runner.assert_one_line_error(batch_norm, 'holds checkpoints of another model',
                               'norm group16', 'norm batch')


@pytest.mark.slow
def test_recompute_sync_batch_norm_nesterov_resume_without_recompute(
    tmp_path):
  model_dir = str(tmp_path / 'recompute')
  first = runner.run_main(runner.TINY + [
      '-md', model_dir, '--enable_recompute', '--sync_batch_norm',
      '--nesterov', '--lr_schedule', 'exponential', '--lr_decay_epochs', '1',
      '--lr_decay_factor', '0.5', '--warmup_epochs', '0', '-te', '2',
      '--enable_checkpoint_and_export'])
  assert first.returncode == 0, first.stderr
  assert '--sync_batch_norm: one replica in the job' in first.stderr
  assert '| lr 0.003125 |' in first.stderr    # 0.1 x 8/256
  assert '| lr 0.0015625 |' in first.stderr   # x0.5 after one epoch
  assert os.path.isdir(os.path.join(model_dir, 'saved_model'))
  # Recomputation changes no variable: the plain model resumes from it.
  second = runner.run_main(runner.TINY + ['-md', model_dir, '-te', '3'])
  assert second.returncode == 0, second.stderr
  assert 'restored from' in second.stderr and 'at step 8' in second.stderr
  assert runner.read_summary(model_dir)['train_steps'] == 12


def test_uint8_loader_bf16_with_python_loop_and_clean(tmp_path):
  model_dir = tmp_path / 'u8'
  model_dir.mkdir()
  # A checkpoint of an earlier run: --clean removes what a run recorded
  # that it wrote.
  (model_dir / 'ckpt-99.index').write_text('old run')
  (model_dir / 'run_files.txt').write_text('"ckpt-99.index"\n')
  result = runner.run_main(runner.TINY + [
      '-md', str(model_dir), '--clean', '-dt', 'bf16', '-dlit', 'uint8',
      '--nouse_tf_while_loop', '--lr_schedule', 'cosine',
      '--profile_steps', '2,4'])
  assert result.returncode == 0, result.stderr
  assert not (model_dir / 'ckpt-99.index').exists()
  assert 'profiler started at step 2' in result.stderr
  assert glob.glob(str(model_dir / 'profile' / '**' / '*.xplane.pb'),
                   recursive=True)
  summary = runner.read_summary(str(model_dir))
  assert summary['eval_examples'] == 13 and summary['train_steps'] == 4


@pytest.mark.slow
def test_keras_applications_backbone(tmp_path):
  model_dir = str(tmp_path / 'app')
  ours = [a for a in runner.TINY if not a.startswith('--width_multiplier')]
  result = runner.run_main(ours + ['-md', model_dir, '--train_steps', '2',
                                   '--keras_applications_model', 'ResNet50V2',
                                   '--skip_eval'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['model'] == 'ResNet50V2' and summary['train_steps'] == 2
  assert 'weight decay uses the single L2 term' in result.stderr


def test_target_accuracy_stops_early_at_the_offset_eval(tmp_path):
  model_dir = str(tmp_path / 'target')
  # Two classes and a seed: the first eval gets some answers right, so a
  # 1% target is reached there. Evals every 2 epochs would first come at
  # epoch 2; the offset brings the first to epoch 1 (of 3).
  result = runner.run_main(runner.TINY + ['-md', model_dir,
                                          '--num_classes', '2',
                                          '--global_seed', '1', '-te', '3',
                                          '-ebe', '2',
                                          '--eval_offset_epochs', '1',
                                          '--target_accuracy', '0.01'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['target_accuracy_reached'] is True
  assert summary['train_steps'] == 4          # stopped after the first epoch
  assert result.stderr.count('eval at step') == 1
  assert 'target accuracy 0.0100 reached at epoch 1.00' in result.stderr
  assert 0 < summary['seconds_to_target'] <= summary['wall_seconds']


@pytest.mark.parametrize('args,fragments', [
    (['--dtype', 'fp64'], ['--dtype=fp64', 'fp32, bf16, fp16']),
    (['--optimizer', 'adam'], ['--optimizer=adam', 'SGD, LARS']),
    (['--lr_schedule', 'onecycle'], ['--lr_schedule=onecycle', 'linear']),
    (['--batch_size', '0'], ['--batch_size must be > 0']),
    (['--resnet_depth', '42'], ['--resnet_depth=42', '18, 34, 50, 101, 152']),
    (['--image_size', '8'], ['--image_size=8', '>= 32']),
    (['-dlit', 'int4'], ['--data_loader_image_type=int4', 'uint8']),
    (['--bogus_flag'], ['bogus_flag']),
    (['--num_classes', '1'], ['--num_classes=1']),
    (['--batch_size', 'many'], ['--batch_size']),
    (['--profile_steps', '5'], ['--profile_steps']),
    (['--norm', 'group', '--groups', '48'], ['--groups=48', '1, 2, 4, 8']),
    (['--keras_applications_model', 'ResNet50', '--norm', 'group'],
     ['--norm=group', 'keras_applications_model']),
    (['--optimizer', 'rmsprop'], ['--optimizer=rmsprop', 'RMSProp']),
    (['--lr_decay_points', '0.5,x'], ['--lr_decay_points', '"0.5,x"']),
    (['--lr_decay_points', '0.8,0.2'], ['--lr_decay_points must be '
                                        'increasing']),
    (['--num_accumulation_steps', '0'], ['--num_accumulation_steps must be > 0']),
])
def test_bad_flags_fail_in_one_line(tmp_path, args, fragments):
  model_dir = tmp_path / 'never'
  # Should a case become valid, it trains a tiny model for a step, not
  # ResNet-50 on 256 images of 224 px (20 GB; the later flag wins).
  result = runner.run_main(['-synth', '-md', str(model_dir)] + runner.TINY +
                           ['--train_steps=1', '--skip_eval'] + args)
  runner.assert_one_line_error(result, *fragments)
  assert not model_dir.exists()


def test_micro_batches_must_split_the_batch_evenly(tmp_path):
  result = runner.run_main(runner.TINY + ['-md', str(tmp_path / 'k3'),
                                          '--num_accumulation_steps', '3'])
  runner.assert_one_line_error(result, 'batch of 8',
                               '--num_accumulation_steps=3', 'multiple of 3')


def test_unwritable_model_dir(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  result = runner.run_main(runner.TINY + ['-md', str(blocker / 'sub')])
  runner.assert_one_line_error(result, '--model_dir',
                               'not a writable directory')
