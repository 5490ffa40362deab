"""Shared test setup: TensorFlow set up as in production, before anything
imports it; and the fixtures tests in more than one folder use (unit/,
e2e/, processes/): TensorFlow's state restored after a test, the tiny
trained run on records, and the datasets a module's unit and end-to-end
tests share. (The synthetic trained run: e2e/conftest.py.)"""

from common import env

env.prepare_tensorflow_environment()

# pylint: disable=g-import-not-at-top,wrong-import-position
import gc
import os
import time

import psutil
import pytest
import tensorflow as tf
import tf_keras

from tests.support import built_once
from tests.support import datasets
from tests.support import records
from tests.support import runner
from resnet_keras.config import hardware
from resnet_keras.training import run  # pylint: disable=unused-import
# pylint: enable=g-import-not-at-top,wrong-import-position

# What the imports made lives as long as the process: frozen out of the
# garbage collections, so the one each in-process run makes at its end
# (run.py) traverses what the tests made, not all of TensorFlow as well
# (0.3-0.5 s per run in a test process that has run others).
gc.collect()
gc.freeze()


def pytest_terminal_summary(terminalreporter):
  """The machine, beside the suite's time at the end of its output (also
  under -q): a time means little without the CPU kind and cores, and CI
  keeps the log of a failed run only."""
  terminalreporter.write_line(
      f'machine: {hardware.this_cpu().describe()}, '
      f'{psutil.cpu_count()} logical CPUs, '
      f'{psutil.virtual_memory().total / 2**30:.0f} GiB')


@pytest.fixture(autouse=True, scope='module')
def collect_each_modules_garbage():
  """A module's tf.data iterators freed as it ends, not by a collection in
  a later module: there an iterator idle for a minute or more blocked its
  destructor for 20-60 s (tf.data's autotuning thread, as run.py says), in
  the first test of the next module (unit/test_trainer.py's first test:
  23.6 s of wall for 4.9 s of CPU). After every test instead of every
  module, the collections cost more than the stalls (unit/: 135 s against
  115 s)."""
  yield
  gc.collect()


@pytest.fixture(autouse=True)
def no_process_left_behind():
  """Every process a test starts has ended when the test has: none is left
  to hold ports, files or a dispatcher's attention in later tests.
  Processes of fixtures set up before the test (a module's cluster) are
  theirs to end; exited ones that were not waited for (zombies) are gone."""
  this = psutil.Process()
  before = {p.pid for p in this.children(recursive=True)}
  yield
  deadline = time.monotonic() + 30  # What a killed job's children may take.
  while True:
    left = [p for p in this.children(recursive=True)
            if p.pid not in before and _alive(p) and not _interpreters(p)]
    if not left or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  assert not left, 'left running: ' + '; '.join(_command(p) for p in left)


def _interpreters(process: psutil.Process) -> bool:
  """multiprocessing's resource tracker: one per interpreter, started by its
  first process pool and ended with the interpreter."""
  try:
    return 'multiprocessing.resource_tracker' in ' '.join(process.cmdline())
  except psutil.NoSuchProcess:
    return False


def _alive(process: psutil.Process) -> bool:
  try:
    return process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _command(process: psutil.Process) -> str:
  try:
    return ' '.join(process.cmdline()[:6])
  except psutil.NoSuchProcess:
    return f'pid {process.pid} (ended)'


@pytest.fixture(autouse=True)
def process_state_unchanged():
  """Fails a test that leaves process-wide state changed: the Keras global
  precision policy, os.environ, XLA auto-clustering. Such a change leaks
  into whichever tests the same pytest worker runs next (a bf16 policy left
  behind failed three unrelated tests once), so it is restored here, but the
  test that left it fails: change such state through a fixture (`policy`,
  monkeypatch.setenv, fresh_tensorflow_state), which restores it whatever
  happens."""
  before = _process_state()
  yield
  after = _process_state()
  if after == before:
    return
  tf_keras.mixed_precision.set_global_policy(before['policy'])
  tf.config.optimizer.set_jit(before['jit'] or False)
  for name in set(after['environ']) - set(before['environ']):
    del os.environ[name]
  os.environ.update(before['environ'])
  changed = sorted(k for k in before if before[k] != after[k])
  environ = sorted(k for k in set(before['environ']) | set(after['environ'])
                   if before['environ'].get(k) != after['environ'].get(k))
  pytest.fail(f'the test left process-wide state changed: {changed} '
              f'(environment variables: {environ}); change it through a '
              'fixture that restores it', pytrace=False)


# Set once per process by the first import of a library, whichever test
# imports it first (scikit-learn and joblib: the KMP_ ones; OpenCV:
# LD_LIBRARY_PATH); and pytest's marker of the running phase.
_SET_BY_OTHERS = ('KMP_DUPLICATE_LIB_OK', 'KMP_INIT_AT_FORK',
                  'LD_LIBRARY_PATH', 'PYTEST_CURRENT_TEST')


def _process_state():
  return {'policy': tf_keras.mixed_precision.global_policy().name,
          'environ': {k: v for k, v in os.environ.items()
                      if k not in _SET_BY_OTHERS},
          'jit': tf.config.optimizer.get_jit()}


@pytest.fixture
def policy():
  """set(name): the Keras global precision policy for this test (e.g.
  'mixed_bfloat16'); the one before is back after it, whatever happens."""
  saved = tf_keras.mixed_precision.global_policy()
  yield tf_keras.mixed_precision.set_global_policy
  tf_keras.mixed_precision.set_global_policy(saved)


@pytest.fixture
def fresh_tensorflow_state():
  """What a run changes process-wide, restored after the test: the Keras
  session and precision policy, and TensorFlow's Python log level."""
  level = tf.get_logger().level
  yield
  runner.reset_tensorflow_state(level)


@pytest.fixture(scope='session')
def records_run(tmp_path_factory):
  """(data_dir, model_dir) of a tiny run on ImageNet-format TFRecords.

  Six classes named in labels.txt (records.CLASS_NAMES), 16 training and 9
  validation images of 40-80 px; 2 epochs of 4 steps with ckpt-4, ckpt-8
  and an export; the class count comes from the data; an eval crop of half
  the short side. Shared by the tool and technique tests (e2e/), which read
  it and may add their outputs beside it: trained once per pytest run, each
  xdist worker given a copy (support/built_once.py; its config.json names
  the data of that one build). Seeded: what the exports are compared
  against is one model on every run and CPU (unseeded, the int8 file's
  largest error ranged
  0.003-0.041 from run to run).
  """
  def build(root):
    data_dir, model_dir = root / 'data', root / 'model'
    records.write_dataset(str(data_dir),
                          num_classes=len(records.CLASS_NAMES),
                          train_per_shard=(8, 8), eval_per_shard=(5, 4))
    (data_dir / 'labels.txt').write_text(
        ''.join(f'{n}\n' for n in records.CLASS_NAMES))
    args = [a for a in runner.TINY if not a.startswith(
        ('--use_synthetic_data', '--num_classes', '--num_eval_examples',
         '--batch_size'))]
    runner.train_tiny(model_dir, args + ['--batch_size=4',
                                         f'--data_dir={data_dir}',
                                         '--eval_crop_fraction=0.5',
                                         '--global_seed=3'])

  root = built_once.built_once(tmp_path_factory, 'records_run', build)
  return str(root / 'data'), str(root / 'model')


# -- Datasets a module's unit and end-to-end tests share ----------------------


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """(root, labels) of 3-class ImageNet-format records (records.
  write_dataset's defaults): test_imagenet_data.py."""
  root = tmp_path_factory.mktemp('imagenet')
  labels = records.write_dataset(str(root))
  return str(root), labels


@pytest.fixture(scope='module')
def clean_dir(tmp_path_factory):
  """3-class ImageNet-format records, nothing corrupt; tests damage a copy
  (records.copy_dataset): test_corrupt_data.py."""
  root = str(tmp_path_factory.mktemp('clean'))
  records.write_dataset(root)
  return root


@pytest.fixture
def cifar10_dir(tmp_path):
  """(root, its test images) of CIFAR-10 binary batches: 5 training files
  of 2 images, a test file of 3: test_cifar_data.py."""
  for i in range(1, 6):
    datasets.write_cifar(tmp_path / f'data_batch_{i}.bin',
                         [i % 10, (i + 3) % 10], 1, i)
  images = datasets.write_cifar(tmp_path / 'test_batch.bin', [1, 2, 3], 1, 0)
  return tmp_path, images


@pytest.fixture
def idx_dir(tmp_path):
  """Fake Fashion-MNIST IDX files; returns (dir, {prefix: (images,
  labels)}): test_fashion_mnist_to_images.py."""
  idx = tmp_path / 'idx'
  idx.mkdir()
  data = {'train': datasets.fake_split(datasets.NUM_TRAIN, 1),
          't10k': datasets.fake_split(datasets.NUM_TEST, 2)}
  for prefix, (images, labels) in data.items():
    datasets.write_idx(idx / f'{prefix}-images-idx3-ubyte.gz', images)
    datasets.write_idx(idx / f'{prefix}-labels-idx1-ubyte.gz', labels)
  return str(idx), data


@pytest.fixture(scope='module')
def service_records(tmp_path_factory):
  """ImageNet-format records: 64 training images, each a flat colour of its
  own (so an image is known by its colour after any crop):
  test_data_service.py."""
  root = str(tmp_path_factory.mktemp('service_records'))
  records.write_dataset(root, num_classes=4, train_per_shard=(32, 32),
                        eval_per_shard=(5, 4))
  return root


@pytest.fixture
def in_process_service():
  """(dispatcher, [worker, worker]) of a tf.data service in this process,
  on loopback: test_data_service.py."""
  svc = tf.data.experimental.service
  dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
  address = dispatcher.target.split('://')[1]
  workers = [svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address))
             for _ in range(2)]
  yield dispatcher, workers
  # A finished run's iterators still beat to the dispatcher until collected.
  tf_keras.backend.clear_session()
  gc.collect()
  for server in workers + [dispatcher]:
    server._stop()  # pylint: disable=protected-access
