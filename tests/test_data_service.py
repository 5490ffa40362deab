"""Training input from a tf.data service (resnet_keras/data/data_service.py): in
this process with in-process servers, then the servers as the processes
users start, killed while a trainer reads from them."""

import collections
import dataclasses
import gc
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf
import tf_keras

from common.errors import UsageError
from resnet_keras import run as run_lib
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import data_service
from tests import e2e
from tests import imagenet_fixture

SVC = tf.data.experimental.service


def test_dispatcher_addresses_and_job_names():
  assert data_service.parse_address('grpc://h2:5050') == ('h2', 5050)
  assert data_service.parse_address('grpc://10.1.2.3:80/') == ('10.1.2.3', 80)
  for bad in ('h2:5050', 'grpc://h2', 'http://h2:5050', 'grpc://:5050',
              'grpc://h2:5050/x', 'grpc://h2:port'):
    with pytest.raises(UsageError, match='give grpc://HOST:PORT'):
      data_service.parse_address(bad)
  # Every worker of a run agrees on its job; a resume or another image
  # size starts another; a name the user gives is the base.
  job = lambda base, model_dir, step, size: data_service.job_name(
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
  data_service.check_servable(plain)
  python = plain.map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
  with pytest.raises(UsageError, match='calls Python'):
    data_service.check_servable(python)
  nested = plain.interleave(
      lambda x: tf.data.Dataset.from_tensors(x).map(
          lambda y: tf.numpy_function(lambda v: v, [y], tf.int64)))
  with pytest.raises(UsageError, match='calls Python'):
    data_service.check_servable(nested)


def _free_ports(n):
  """n distinct loopback ports nothing listens on (bound together, so
  distinct, then released)."""
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def test_no_dispatcher_is_one_line_and_quick():
  port = _free_ports(1)[0]
  start = time.monotonic()
  with pytest.raises(UsageError) as raised:
    data_service.check_reachable(f'grpc://127.0.0.1:{port}', timeout=5)
  assert time.monotonic() - start < 5
  assert str(raised.value).startswith(
      f'no tf.data service dispatcher at grpc://127.0.0.1:{port} '
      '(Connection refused)')


def test_watchdog_ends_only_a_long_wait_for_input():
  now = time.time()
  waits = {'none': lambda: 0.0, 'short': lambda: time.time() - 0.05,
           'long': lambda: now - 10}
  fired = collections.defaultdict(list)
  dogs = [data_service.InputWatchdog(1.0, since, fired[name].append,
                                poll=0.02).start()
          for name, since in waits.items()]
  time.sleep(0.3)
  for dog in dogs:
    dog.stop()
  assert not fired['none'] and not fired['short']
  assert len(fired['long']) == 1 and fired['long'][0] >= 10
  # timeout 0: never watches.
  assert data_service.InputWatchdog(0, waits['long'], None).start()._thread is None


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  """ImageNet-format records: 64 training images, each a flat colour of its
  own (so an image is known by its colour after any crop)."""
  root = str(tmp_path_factory.mktemp('service_records'))
  imagenet_fixture.write_dataset(root, num_classes=4,
                                 train_per_shard=(32, 32),
                                 eval_per_shard=(5, 4))
  return root


@pytest.fixture
def in_process_service():
  """(dispatcher, [worker, worker]) in this process, on loopback."""
  dispatcher = SVC.DispatchServer(SVC.DispatcherConfig(port=0))
  address = dispatcher.target.split('://')[1]
  workers = [SVC.WorkerServer(SVC.WorkerConfig(dispatcher_address=address))
             for _ in range(2)]
  yield dispatcher, workers
  # A finished run's iterators still beat to the dispatcher until collected.
  tf_keras.backend.clear_session()
  gc.collect()
  for server in workers + [dispatcher]:
    server._stop()  # pylint: disable=protected-access


def _config(model_dir, records_dir, address, **overrides):
  return e2e.tiny_config(model_dir, **{
      'use_synthetic_data': False, 'data_dir': records_dir,
      'num_classes': 0, 'num_eval_examples': 0,
      'tf_data_service': address, 'tf_data_service_timeout': 60,
      **overrides})


def _colours(batches):
  """Each image's colour (its centre pixel), as a tuple."""
  return [tuple(image[image.shape[0] // 2, image.shape[1] // 2])
          for images, _ in batches for image in images.numpy()]


@pytest.mark.parametrize('sharding', ['off', 'dynamic'])
def test_two_data_workers_serve_different_images(records, tmp_path,
                                                 in_process_service,
                                                 sharding):
  """Even with --global_seed (TensorFlow's global seed set), the two
  workers' shares differ: 32 batches of 4 are two epochs of 64 images; two
  workers serving the same stream would give each image twice in its
  first half-epoch (32 distinct of the first 64 read)."""
  dispatcher, _ = in_process_service
  cfg = _config(tmp_path, records, dispatcher.target, global_seed=7,
                tf_data_service_sharding=sharding,
                data_loader_image_type='uint8')
  tf.random.set_seed(7)
  info = datasets.describe(cfg)
  read = data_service.training_input_fn(cfg, info, 4, start_step=0)
  first = _colours(read(tf.distribute.InputContext()).take(16))
  assert len(set(first)) > 40, len(set(first))


def test_a_run_trains_from_the_service_and_resumes_without_it(
    records, tmp_path, in_process_service):
  dispatcher, workers = in_process_service
  cfg = _config(tmp_path, records, dispatcher.target, train_steps=2,
                enable_checkpoint_and_export=True)
  summary = run_lib.run(cfg)
  assert summary['train_steps'] == 2
  assert summary['tf_data_service'] == {
      'address': dispatcher.target, 'sharding': 'off', 'data_workers': None}
  # Its batches came from the service's workers.
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access
  # Resumed from its checkpoint through the service (a new job), then
  # without it.
  resumed = run_lib.run(dataclasses.replace(cfg, train_steps=4))
  assert resumed['resumed_from_step'] == 2 and resumed['train_steps'] == 4
  local = run_lib.run(dataclasses.replace(cfg, train_steps=6,
                                          tf_data_service=''))
  assert local['resumed_from_step'] == 4 and local['train_steps'] == 6
  assert local['tf_data_service'] is None
  # A dispatcher that is not there: one line before anything trains.
  with pytest.raises(UsageError, match='no tf.data service dispatcher'):
    run_lib.run(dataclasses.replace(
        cfg, train_steps=8, tf_data_service=f'grpc://127.0.0.1:{_free_ports(1)[0]}'))
  assert not os.path.exists(os.path.join(str(tmp_path), 'ckpt-8.index'))


# -- The servers as processes, and faults -------------------------------------


def _server(role, port, log_dir, *args):
  """`python -m resnet_keras.data.service role`, its output in a file (a
  pipe nobody reads would fill and stall it)."""
  log = open(os.path.join(log_dir, f'{role}-{port}.log'), 'a')
  process = subprocess.Popen(
      [sys.executable, '-m', 'resnet_keras.data.service', role,
       '--port', str(port)] + list(args),
      cwd=e2e.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
  process.log_path = log.name
  return process


def _wait_for_line(process, fragment, timeout=120):
  """The first line of `process`'s log containing `fragment` (waits)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(process.log_path) as f:
      for line in f:
        if fragment in line:
          return line
    assert process.poll() is None, open(process.log_path).read()[-3000:]
    time.sleep(0.2)
  raise AssertionError(f'no "{fragment}" in:\n' +
                       open(process.log_path).read()[-3000:])


class _Log:
  """A process's output lines, read as they come (a thread per process)."""

  def __init__(self, process):
    import threading  # pylint: disable=g-import-not-at-top
    self.lines = []
    self._thread = threading.Thread(
        target=lambda: [self.lines.append(l) for l in process.stdout],
        daemon=True)
    self._thread.start()

  def last_step(self):
    steps = [int(l.split('step ')[1].split('/')[0]) for l in self.lines
             if ' I step ' in l]
    return steps[-1] if steps else 0

  def wait_for_step(self, step, timeout=120):
    deadline = time.monotonic() + timeout
    while self.last_step() < step:
      assert time.monotonic() < deadline, ''.join(self.lines[-20:])
      time.sleep(0.2)
    return self.last_step()


@pytest.mark.processes
def test_faults_a_lost_worker_a_restarted_dispatcher_the_last_worker(
    records, tmp_path):
  """One trainer through three faults: a data worker killed while another
  serves (training goes on), the dispatcher killed and restarted from its
  work_dir (goes on), the last data worker killed (the run ends with one
  line within --tf_data_service_timeout and a poll)."""
  dispatcher_port, *worker_ports = _free_ports(3)
  work_dir = str(tmp_path / 'dispatcher')
  logs = str(tmp_path)
  servers = [_server('dispatcher', dispatcher_port, logs, '--work_dir',
                     work_dir)]
  trainer = None
  try:
    assert 'fault tolerant' in _wait_for_line(servers[0], 'ready at')
    for port in worker_ports:
      servers.append(_server('worker', port, logs, '--dispatcher',
                             f'127.0.0.1:{dispatcher_port}'))
      _wait_for_line(servers[-1], 'ready at 127.0.0.1:')
    timeout = 15
    trainer = subprocess.Popen(
        [sys.executable, e2e.MAIN] + [
            a for a in e2e.TINY if not a.startswith(
                ('--use_synthetic_data', '--num_classes', '--train_steps'))] +
        [f'--data_dir={records}', '--train_steps=1000000',
         '--train_epochs=100000', '--epochs_between_evals=100000',
         f'--model_dir={tmp_path / "model"}', '--log_steps=2',
         '--tf_data_service', f'grpc://127.0.0.1:{dispatcher_port}',
         f'--tf_data_service_timeout={timeout}'],
        cwd=e2e.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    log = _Log(trainer)
    step = log.wait_for_step(10)
    assert all('| input wait ' in l for l in log.lines if ' I step ' in l)

    servers[1].kill()  # A data worker; the other serves.
    step = log.wait_for_step(step + 40)

    servers[0].kill()  # The dispatcher, restarted from its journal.
    servers[0].wait()
    servers[0] = _server('dispatcher', dispatcher_port, logs, '--work_dir',
                         work_dir)
    _wait_for_line(servers[0], 'ready at')
    step = log.wait_for_step(step + 40)

    servers[2].kill()  # The last data worker.
    killed = time.monotonic()
    assert trainer.wait(timeout=timeout + 60) == data_service.STALLED_EXIT_CODE
    assert time.monotonic() - killed < timeout + 30
    last = log.lines[-1].strip()
    assert last.startswith('error: no batch from the tf.data service at '
                           f'grpc://127.0.0.1:{dispatcher_port} for ')
    assert 'Traceback' not in ''.join(log.lines)
  finally:
    for process in servers + [trainer]:
      if process and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
          process.wait(timeout=10)
        except subprocess.TimeoutExpired:
          process.kill()


@pytest.mark.processes
@pytest.mark.xdist_group('mpirun')
@pytest.mark.parametrize('backend_args,batch', [
    (['--use_horovod'], 8), (['-ds', 'multi_worker_mirrored'], 16)])
def test_two_workers_read_one_job(records, tmp_path, in_process_service,
                                  backend_args, batch):
  """Horovod and multi_worker_mirrored workers (2 processes through the
  launcher) read their batches from one job and train in step."""
  dispatcher, workers = in_process_service
  model_dir = str(tmp_path / 'model')
  args = [a for a in e2e.TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes', '--batch_size'))]
  result = e2e.spawn_script(
      os.path.join(e2e.REPO_ROOT, 'demo_resnet_keras.py'),
      backend_args + ['--num_workers_per_hls=2', f'--batch_size={batch}',
                      f'--data_dir={records}', f'--model_dir={model_dir}',
                      f'--tf_data_service={dispatcher.target}'] + args,
      timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  chief = e2e.read_summary(model_dir)
  worker = e2e.read_summary(os.path.join(model_dir, 'worker_1'))
  assert chief['tf_data_service']['address'] == dispatcher.target
  assert worker['tf_data_service'] == chief['tf_data_service']
  assert chief['weights_sha256'] == worker['weights_sha256']
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access


@pytest.mark.processes
def test_mirrored_replicas_read_the_service(records, tmp_path,
                                            in_process_service):
  """Two replicas of one process (-ds mirrored over logical CPUs) each
  read their batches from the job."""
  dispatcher, workers = in_process_service
  model_dir = str(tmp_path / 'model')
  args = [a for a in e2e.TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes', '--batch_size'))]
  result = e2e.spawn_main(
      args + ['-ds', 'mirrored', '--num_cpu_replicas=2', '--batch_size=8',
              f'--data_dir={records}', f'--model_dir={model_dir}',
              f'--tf_data_service={dispatcher.target}'], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = e2e.read_summary(model_dir)
  assert summary['num_replicas'] == 2 and summary['train_steps'] == 4
  assert summary['tf_data_service']['address'] == dispatcher.target
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access


def test_a_server_that_is_not_a_dispatcher_is_one_line(in_process_service):
  """What a client meets at a server of another protocol (another
  TensorFlow version's dispatcher answers the same way): a data worker's
  port does not serve the dispatcher's calls."""
  _, workers = in_process_service
  address = f'grpc://{workers[0]._address}'  # pylint: disable=protected-access
  with pytest.raises(UsageError, match='does not answer as a tf.data service '
                     'dispatcher of TensorFlow'):
    data_service.register(tf.data.Dataset.range(3), address, 'job')
