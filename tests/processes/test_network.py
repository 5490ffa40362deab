"""Synchronised batch norm over two replicas (logical CPUs, fixed when
TensorFlow's runtime starts: a process of its own) against the batch
statistics computed by hand, and the statistics read as checkpoints hold
them. (The rest of the model's structure: unit/.)"""

import json
import subprocess
import sys

import numpy as np
import pytest

from resnet_keras.model import network as network_lib
from tests.support import runner


_SYNC_BN_SCRIPT = '''
import json
from common import env
env.prepare_tensorflow_environment()
import numpy as np
import tensorflow as tf
from resnet_keras.model import network as network_lib
from resnet_keras.config import RunConfig
from resnet_keras.rundir import checkpoints

cpu = tf.config.list_physical_devices('CPU')[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
# Two replicas with different batches (3 and 3 images of 2x2x4).
batches = (np.random.RandomState(0).normal(size=[2, 3, 2, 2, 4]) *
           np.array([1.0, 3.0])[:, None, None, None, None] +
           np.array([0.0, 5.0])[:, None, None, None, None])
inputs = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(batches[ctx.replica_id_in_sync_group], tf.float32))
got = {'inputs': batches.tolist()}
for mode in ('sync', 'local'):
  sync = mode == 'sync'
  with strategy.scope():
    layer = network_lib.norm_factory('batch', sync_batch_norm=sync)(
        f'bn_{mode}')
    network = network_lib.build_network(
        RunConfig(resnet_depth=10, width_multiplier=0.25, image_size=32,
                  sync_batch_norm=sync), 10, use_regularizers=False)
  outputs = strategy.run(tf.function(lambda x: layer(x, training=True)),
                         args=(inputs,))
  got[mode] = {
      'replicas': strategy.num_replicas_in_sync,
      'outputs': [o.numpy().tolist()
                  for o in strategy.experimental_local_results(outputs)],
      'moving_mean': layer.moving_mean.numpy().tolist(),
      'moving_variance': layer.moving_variance.numpy().tolist(),
      'network_synchronized':
          network.get_layer('stage1_block1_bn1').synchronized,
      # The layer's weights as checkpoints and exports read them, and as
      # TensorFlow reads each.
      'packed_read': [v.tolist() for v in checkpoints.values(layer.weights)],
      'own_read': [w.numpy().tolist() for w in layer.weights]}
print(json.dumps(got))
'''


@pytest.fixture(scope='module')
def sync_batch_norm_results():
  """What a batch-norm layer, synchronised and not, computed on two
  replicas (logical CPUs: a process of its own)."""
  result = subprocess.run([sys.executable, '-c', _SYNC_BN_SCRIPT],
                          cwd=runner.REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group('sync_batch_norm')  # Its fixture: one process.
@pytest.mark.parametrize('mode', ['sync', 'local'])
def test_sync_batch_norm_uses_the_global_batch_statistics(
    sync_batch_norm_results, mode):
  got = sync_batch_norm_results[mode]
  assert got['replicas'] == 2
  assert got['network_synchronized'] == (mode == 'sync')
  batches = np.array(sync_batch_norm_results['inputs'])
  outputs = np.array(got['outputs'])
  if mode == 'sync':  # Statistics over both replicas' 6 images.
    means = np.broadcast_to(batches.mean(axis=(0, 1, 2, 3)), (2, 4))
    variances = np.broadcast_to(batches.var(axis=(0, 1, 2, 3)), (2, 4))
  else:  # Each replica its own 3 images.
    means, variances = batches.mean(axis=(1, 2, 3)), batches.var(axis=(1, 2, 3))
  for replica in range(2):
    expected = ((batches[replica] - means[replica]) /
                np.sqrt(variances[replica] + network_lib.BN_EPSILON))
    np.testing.assert_allclose(outputs[replica], expected, rtol=1e-4,
                               atol=1e-4)
  if mode == 'sync':
    # One update with momentum 0.9 from mean 0 and variance 1.
    np.testing.assert_allclose(got['moving_mean'], 0.1 * means[0], rtol=1e-4)
    np.testing.assert_allclose(got['moving_variance'],
                               0.9 + 0.1 * variances[0], rtol=1e-4)


@pytest.mark.xdist_group('sync_batch_norm')
def test_the_checkpoints_packed_read_is_tensorflows_own(
    sync_batch_norm_results):
  """Unsynchronised, each replica keeps statistics of its own batch; read
  from outside the replicas, a statistic is their mean. checkpoints.values
  (what checkpoints and exports hold) reads them all in one all-reduce:
  the values of TensorFlow's own read, one all-reduce each."""
  got = sync_batch_norm_results['local']
  batches = np.array(sync_batch_norm_results['inputs'])
  # The replicas' moving means (one update from 0) differ: their mean is
  # neither's.
  np.testing.assert_allclose(
      got['moving_mean'], 0.1 * batches.mean(axis=(1, 2, 3)).mean(axis=0),
      rtol=1e-4)
  assert len(got['packed_read']) == len(got['own_read']) == 4
  for packed, own in zip(got['packed_read'], got['own_read']):
    np.testing.assert_allclose(packed, own, rtol=1e-6)
