"""Training input from a tf.data service (resnet_keras/data/input_service.py),
in this process: addresses and job names, what a config or pipeline a
service cannot serve is told, the input watchdog, and in-process servers
feeding the input fn. (A run through the service: e2e/; the servers as
processes, and faults: processes/.)"""

import re
import time

import pytest
import tensorflow as tf

from common.errors import UsageError
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import input_service
from testbed.ports import free_ports
from tests.support.data_service import service_config


def test_dispatcher_addresses_and_job_names():
  assert input_service.parse_address('grpc://h2:5050') == ('h2', 5050)
  assert input_service.parse_address('grpc://10.1.2.3:80/') == ('10.1.2.3', 80)
  assert input_service.parse_address('grpc://[::1]:5050') == ('::1', 5050)
  with pytest.raises(UsageError, match=re.escape(
      'give grpc://HOST:PORT (an IPv6 address in brackets: '
      'grpc://[::1]:5050)')):
    input_service.parse_address('grpc://::1:5050')
  for bad in ('h2:5050', 'grpc://h2', 'http://h2:5050', 'grpc://:5050',
              'grpc://h2:5050/x', 'grpc://h2:port'):
    with pytest.raises(UsageError, match='give grpc://HOST:PORT'):
      input_service.parse_address(bad)
  # Every worker of a run agrees on its job; a resume or another image
  # size starts another; a name the user gives is the base.
  job = lambda base, model_dir, step, size: input_service.job_name(
      base, model_dir, step, size)
  assert job('', '/m/run', 0, 64) == job('', '/m/run/', 0, 64)
  assert job('', '/m/run', 0, 64) != job('', '/m/run', 40, 64)
  assert job('', '/m/run', 0, 64) != job('', '/m/run', 0, 96)
  assert job('', '/m/run', 0, 64) != job('', '/m/other', 0, 64)
  assert job('mine', '/m/run', 40, 64) == 'mine_step40_64px'


@pytest.mark.parametrize('overrides,fragment', [
    (dict(skip_corrupt_records=True), '--skip_corrupt_records counts'),
    (dict(use_synthetic_data=True), '--use_synthetic_data makes'),
    (dict(tf_data_service_sharding='static'), 'use one of: off, dynamic'),
    (dict(tf_data_service_timeout=-1), 'must be >= 0'),
])
def test_config_refuses_what_a_service_cannot_serve(overrides, fragment):
  cfg = RunConfig(tf_data_service='grpc://h2:5050', **overrides)
  with pytest.raises(UsageError, match=fragment):
    cfg.check()


def test_python_in_the_pipeline_is_refused():
  plain = tf.data.Dataset.range(4).map(lambda x: x * 2)
  input_service.check_servable(plain)
  python = plain.map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
  with pytest.raises(UsageError, match='calls Python'):
    input_service.check_servable(python)
  nested = plain.interleave(
      lambda x: tf.data.Dataset.from_tensors(x).map(
          lambda y: tf.numpy_function(lambda v: v, [y], tf.int64)))
  with pytest.raises(UsageError, match='calls Python'):
    input_service.check_servable(nested)


def test_no_dispatcher_is_one_line_and_quick():
  port = free_ports(1)[0]
  start = time.monotonic()
  with pytest.raises(UsageError) as raised:
    input_service.check_reachable(f'grpc://127.0.0.1:{port}', timeout=5)
  assert time.monotonic() - start < 5
  assert str(raised.value).startswith(
      f'no tf.data service dispatcher at grpc://127.0.0.1:{port} '
      '(Connection refused)')


def _colours(batches):
  """Each image's colour (its centre pixel), as a tuple."""
  return [tuple(image[image.shape[0] // 2, image.shape[1] // 2])
          for images, _ in batches for image in images.numpy()]


@pytest.mark.parametrize('sharding', ['off', 'dynamic'])
def test_two_data_workers_serve_different_images(service_records, tmp_path,
                                                 in_process_service,
                                                 sharding):
  """Even with --global_seed (TensorFlow's global seed set), the two
  workers' shares differ: 32 batches of 4 are two epochs of 64 images; two
  workers serving the same stream would give each image twice in its
  first half-epoch (32 distinct of the first 64 read)."""
  dispatcher, _ = in_process_service
  cfg = service_config(tmp_path, service_records, dispatcher.target,
                       global_seed=7, tf_data_service_sharding=sharding,
                       data_loader_image_type='uint8')
  tf.random.set_seed(7)
  info = datasets.describe(cfg)
  read = input_service.training_input_fn(cfg, info, 4, start_step=0)
  first = _colours(read(tf.distribute.InputContext()).take(16))
  assert len(set(first)) > 40, len(set(first))


def test_a_server_that_is_not_a_dispatcher_is_one_line(in_process_service):
  """What a client meets at a server of another protocol (another
  TensorFlow version's dispatcher answers the same way): a data worker's
  port does not serve the dispatcher's calls."""
  _, workers = in_process_service
  address = f'grpc://{workers[0]._address}'  # pylint: disable=protected-access
  with pytest.raises(UsageError, match='does not answer as a tf.data service '
                     'dispatcher of TensorFlow'):
    input_service.register(tf.data.Dataset.range(3), address, 'job')


def test_every_augmentation_is_served_by_a_service_job(service_records,
                                                       tmp_path,
                                                       in_process_service):
  """RandAugment, random erasing, repeated augmentation and mixup/CutMix are
  TensorFlow ops: the pipeline passes check_servable and a service worker
  runs it; the batches come back mixed (soft targets)."""
  dispatcher, _ = in_process_service
  cfg = service_config(tmp_path, service_records, dispatcher.target,
                       global_seed=7, tf_data_service_sharding='dynamic',
                       data_loader_image_type='uint8',
                       randaugment='rand-m9-n2-mstd0.5-inc1',
                       random_erasing=0.5, repeated_augmentation=2,
                       mixup_alpha=0.2, cutmix_alpha=1.0,
                       label_smoothing=0.1)
  tf.random.set_seed(7)
  info = datasets.describe(cfg)
  read = input_service.training_input_fn(cfg, info, 4, start_step=0)
  batches = list(read(tf.distribute.InputContext()).take(3))
  for images, targets in batches:
    assert images.dtype == tf.uint8 and images.shape[0] == 4
    assert targets.shape == (4, info.num_classes)
    assert abs(float(tf.reduce_sum(targets)) - 4) < 1e-4
