"""-ds mirrored with 1, 2 and 4 replicas (--num_cpu_replicas: logical CPUs),
and -ds one_device, through resnet_ctl_imagenet_main.py: the paths a GPU
user takes, trained, evaluated, checkpointed, exported and resumed on a
CPU. Runs on logical CPUs are processes of their own (the split is fixed
when TensorFlow's runtime starts); one-replica runs call main in this
process."""

import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.engine import metrics
from tests.support import runner
from tests.support.records import write_dataset

# The runs the tests share are built once, in one worker.
pytestmark = pytest.mark.xdist_group('mirrored')

# 16 training images (2 steps of 8 per epoch) and 9 validation images: not
# a multiple of the global batch, nor of any replica count's share of it.
# No plots: no test reads them, and they took 3 of a one-replica run's 17 s
# of CPU.
ARGS = ['--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--batch_size=8', '--steps_per_loop=2', '--log_steps=1',
        '--global_seed=3', '--dtype=fp32', '--noplots',
        # What the runs evaluate, export and resume is then the weight
        # average: one set over the replicas, as one replica's.
        '--ema_decay=0.5']


def _train(data_dir, model_dir, replicas, *extra, strategy='mirrored',
           evaluate=True, save=True):
  """A run's summary, after 2 epochs. `evaluate`, `save` (checkpoints and an
  export): False where no test reads them (a 4-replica resume took 36 s of
  CPU with both, 27 s without)."""
  args = ARGS + [f'--data_dir={data_dir}', f'--model_dir={model_dir}',
                 '--train_epochs=2', '-ds', strategy] + list(extra)
  args += [] if evaluate else ['--skip_eval']
  args += ['--enable_checkpoint_and_export'] if save else []
  if replicas > 1:
    result = runner.spawn_main(args + [f'--num_cpu_replicas={replicas}'])
  else:
    result = runner.run_main(args)
  assert result.returncode == 0, result.stderr[-3000:]
  return runner.read_summary(model_dir)


def _losses(model_dir):
  return [(r['step'], r['train_loss'], r['train_accuracy'])
          for r in metrics.read_metrics_log(model_dir) if 'train_loss' in r]


def _evals(model_dir):
  return [(r['eval_loss'], r['eval_accuracy'], r['eval_examples'])
          for r in metrics.read_metrics_log(model_dir) if 'eval_loss' in r]


def _assert_same_math(run, reference):
  steps = [s for s, _, _ in _losses(reference)]
  assert [s for s, _, _ in _losses(run)] == steps == [1, 2, 3, 4]
  np.testing.assert_allclose(np.array(_losses(run))[:, 1:],
                             np.array(_losses(reference))[:, 1:], rtol=2e-4)
  np.testing.assert_allclose(np.array(_evals(run)), np.array(_evals(reference)),
                             rtol=2e-4)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """model_dirs by name: 1, 2 and 4 replicas with synchronised batch norm,
  2 without; all on the same records, seed and global batch. (One replica
  with sync batch norm, since tf_keras's plain one-device batch norm is the
  fused kernel, whose moving variance is Bessel-corrected: the evaluations
  would differ by that alone.)"""
  root = tmp_path_factory.mktemp('mirrored')
  data_dir = str(root / 'data')
  write_dataset(data_dir, num_classes=6, train_per_shard=(8, 8),
                eval_per_shard=(5, 4))
  dirs = {}
  # (The run without sync batch norm is read for its losses and export.)
  for name, replicas, extra in [('1_sync', 1, ('--sync_batch_norm',)),
                                ('2_sync', 2, ('--sync_batch_norm',)),
                                ('4_sync', 4, ('--sync_batch_norm',)),
                                ('2', 2, ())]:
    dirs[name] = str(root / name)
    summary = _train(data_dir, dirs[name], replicas, *extra,
                     evaluate=name != '2')
    assert summary['num_replicas'] == replicas
    assert summary['global_batch_size'] == 8
  dirs['data'] = data_dir
  return dirs


@pytest.mark.parametrize('name', ['2_sync', '4_sync'])
def test_replicas_with_sync_batch_norm_train_the_same_math(runs, name):
  """The global batch split over replicas, losses and accuracies reduced over
  them, batch statistics over all of them: one replica's numbers."""
  _assert_same_math(runs[name], runs['1_sync'])
  # Every validation example once, though 9 splits evenly over no replicas.
  assert [n for _, _, n in _evals(runs[name])] == [9, 9]


def test_one_device_trains_what_one_mirrored_replica_does(runs, tmp_path):
  model_dir = str(tmp_path / 'one_device')
  summary = _train(runs['data'], model_dir, 1, '--sync_batch_norm',
                   strategy='one_device')
  assert summary['num_replicas'] == 1
  _assert_same_math(model_dir, runs['1_sync'])
  assert os.path.exists(os.path.join(model_dir, 'saved_model'))


def test_without_sync_each_replica_normalises_by_its_own_batch(runs):
  ours = np.array(_losses(runs['2']))
  one = np.array(_losses(runs['1_sync']))
  # Step 1's forward pass already normalises by half-batch statistics.
  assert not np.allclose(ours[0, 1], one[0, 1], rtol=1e-3)


def test_a_checkpoint_holds_the_mean_of_the_replicas_statistics(runs):
  """Without sync batch norm each replica keeps moving statistics of its own
  batches. A checkpoint holds their mean: from a process's second save on
  it reads them all in one all-reduce (checkpoints._means_over_replicas);
  the export reads them through checkpoints.values, the first save through
  TensorFlow's own read (the packed read against TensorFlow's:
  processes/test_network.py)."""
  model_dir = runs['2']
  assert runner.checkpoint_steps(model_dir)[-2:] == [2, 4]
  # The export is of the weight average: set against the checkpoint's,
  # both in the order of the model's variables.
  saved = runner.checkpoint_values(
      os.path.join(model_dir, 'ckpt-4'),
      lambda name: name.startswith('weight_average/averages/'))
  exported = runner.checkpoint_values(
      os.path.join(model_dir, 'saved_model', 'variables', 'variables'),
      lambda name: name.startswith('variables/'))
  assert len(saved) == len(exported) > 0
  for name, value in exported.items():
    np.testing.assert_allclose(
        saved[name.replace('variables/', 'weight_average/averages/', 1)],
        value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_replicated_export_serves_the_same_model(runs):
  pixels = tf.constant(np.random.RandomState(0).uniform(
      0, 255, (3, 32, 32, 3)).astype(np.float32))

  def predict(name):
    loaded = tf.saved_model.load(os.path.join(runs[name], 'saved_model'))
    return loaded.signatures['serving_default'](
        images=pixels)['probabilities'].numpy()

  one = predict('1_sync')
  np.testing.assert_allclose(predict('4_sync'), one, rtol=1e-3, atol=1e-5)
  # Another model (batch statistics per replica) is well outside that.
  assert not np.allclose(predict('2'), one, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize('replicas', [1, 4])
def test_a_two_replica_checkpoint_resumes_with_other_counts(runs, tmp_path,
                                                            replicas):
  """The two-replica run, interrupted after its first epoch and resumed on
  fewer or more replicas, computes its second epoch as the one-replica run
  did."""
  model_dir = str(tmp_path / 'resumed')
  runner.copy_run_up_to(runs['2_sync'], 2, model_dir)
  summary = _train(runs['data'], model_dir, replicas, '--sync_batch_norm',
                   evaluate=False, save=False)
  assert summary['resumed_from_step'] == 2 and summary['train_steps'] == 4
  assert summary['num_replicas'] == replicas
  resumed = np.array(_losses(model_dir))
  expected = np.array(_losses(runs['1_sync']))
  assert list(resumed[:, 0]) == [3, 4]
  # Float rounding of another replica count grows step by step (2e-4 after
  # 4 steps, 1e-3 after 6; larger learning rates amplify it faster).
  np.testing.assert_allclose(resumed[:, 1:], expected[2:, 1:], rtol=3e-3)
