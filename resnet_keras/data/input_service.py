"""Training input from a tf.data service: the pipeline runs on other machines.

  # on the data hosts (or let demo_resnet_keras.py --data_service_hosts do it)
  python -m resnet_keras.data.service dispatcher --port 5050 --work_dir /tmp/d
  python -m resnet_keras.data.service worker --dispatcher h2:5050 --port 5051
  # the trainer
  python resnet_ctl_imagenet_main.py ... --tf_data_service grpc://h2:5050

This module is the trainers' side and the servers' set-up; the servers'
command line is service.py.

With --tf_data_service the trainer builds its training pipeline as always
(same parsing and augmentation), registers it with the dispatcher, and reads
batches from the service's workers instead of running it. Evaluation stays
local. Every replica of every worker reads the same job (`job_name`), so each
batch goes to one consumer: workers see distinct batches.

Sharding (--tf_data_service_sharding): `off` (default) gives each data
worker the whole shuffled, repeated stream, so batches are visited at least
once across workers, never waiting on a slow one; `dynamic` splits the files
among data workers, each record once per epoch (at most once: a lost data
worker's share of the epoch is lost with it). Neither keeps --global_seed's order: a service run is not
bit-reproducible, and its resume does not skip what was read (it starts a
new job).

A dispatcher lost for good, or every data worker lost, would leave the
trainer waiting on the next batch forever (tensorflow#56490): the trainer's
input watchdog ends the run after --tf_data_service_timeout seconds without
a batch, naming the service (0: wait).
"""

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import sys
import threading
from typing import Callable, Optional, Tuple
from urllib import parse

import tensorflow as tf

from common import hosts
from common.errors import UsageError

SHARDING = {'off': tf.data.experimental.service.ShardingPolicy.OFF,
            'dynamic': tf.data.experimental.service.ShardingPolicy.DYNAMIC}
PROTOCOL = 'grpc'
ROLES = ('dispatcher', 'worker')  # The servers, one per process.


def parse_address(address: str,
                  flag: str = '--tf_data_service') -> Tuple[str, int]:
  """(host, port) of a 'grpc://HOST:PORT' dispatcher address (an IPv6
  host in brackets: grpc://[::1]:5050), given as `flag`."""
  parsed = parse.urlsplit(address)
  try:
    if parsed.scheme == PROTOCOL and parsed.path in ('', '/'):
      return hosts.split_host_port(parsed.netloc, address)
  except UsageError:
    pass
  ipv6 = (' (an IPv6 address in brackets: grpc://[::1]:5050)'
          if parsed.netloc.count(':') > 1 else '')
  raise UsageError(f'{flag}={address} is not a dispatcher address: give '
                   f'grpc://HOST:PORT{ipv6}')


def job_name(base: str, model_dir: str, start_step: int,
             image_size: int) -> str:
  """The job the run's workers read: the same in each of them (they know
  its model_dir, the step it starts at and its size), another for each
  resume and image size (a job serves one dataset). `base`: the user's
  --tf_data_service_job_name, '' for one named after model_dir."""
  if not base:
    digest = hashlib.sha1(os.path.abspath(model_dir).encode()).hexdigest()
    base = f'resnet_keras_{digest[:12]}'
  return f'{base}_step{start_step}_{image_size}px'


def check_reachable(address: str, timeout: float) -> None:
  """A TCP connection to the dispatcher, or one line saying why not. Before
  any TensorFlow call, which would retry an absent dispatcher forever."""
  host, port = parse_address(address)
  try:
    with socket.create_connection((host, port), timeout=timeout or None):
      pass
  except OSError as e:
    reason = 'timed out' if isinstance(e, socket.timeout) else (
        e.strerror or str(e))
    raise UsageError(
        f'no tf.data service dispatcher at {address} ({reason}): start one '
        '(python -m resnet_keras.data.service dispatcher --port '
        f'{port}) or fix --tf_data_service') from None


def register(dataset: tf.data.Dataset, address: str, job: str) -> str:
  """Registers `dataset` under the id `job` (the same id and dataset from
  every worker of a run); one line if the service refuses it."""
  try:
    return tf.data.experimental.service.register_dataset(
        address, dataset, dataset_id=job)
  except tf.errors.UnimplementedError:
    # What a client meets at a server of another protocol version (or at
    # something that is not a dispatcher at all).
    raise UsageError(
        f'{address} does not answer as a tf.data service dispatcher of '
        f'TensorFlow {tf.__version__} (this trainer\'s): run the service '
        'with the trainer\'s TensorFlow version, or fix --tf_data_service'
    ) from None
  except tf.errors.OpError as e:
    message = ' '.join(e.message.split())
    raise UsageError(f'the tf.data service at {address} refused the training '
                     f'pipeline: {message}') from None


def reader(address: str, dataset_id: str, element_spec, job: str,
           sharding: str) -> tf.data.Dataset:
  """The registered dataset read from the service's workers as part of
  `job` (every consumer of a job gets other elements)."""
  return tf.data.experimental.service.from_dataset_id(
      processing_mode=SHARDING[sharding], service=address,
      dataset_id=dataset_id, element_spec=element_spec, job_name=job)


STALLED_EXIT_CODE = 1


def end_stalled_run(address: str) -> Callable[[float], None]:
  """The input watchdog's `on_timeout` for a service run (watchdog.py): one line, then the
  process ends (from the watchdog's thread: the training thread is stuck in
  the service read). Checkpoints already written are intact."""

  def end(waited: float) -> None:
    print(f'error: no batch from the tf.data service at {address} for '
          f'{waited:.0f} s (--tf_data_service_timeout): its data workers are '
          'lost or stalled; start them again and rerun to resume from the '
          'last checkpoint', file=sys.stderr, flush=True)
    os._exit(STALLED_EXIT_CODE)  # pylint: disable=protected-access

  return end


_PYTHON_OPS = ('PyFunc', 'PyFuncStateless', 'EagerPyFunc')


def check_servable(dataset: tf.data.Dataset) -> None:
  """Refuses a pipeline that calls Python: a service worker has no Python
  interpreter of ours to run it in."""
  graph = tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  nodes = list(graph.node) + [n for f in graph.library.function
                              for n in f.node_def]
  if any(node.op in _PYTHON_OPS for node in nodes):
    raise UsageError('the training pipeline calls Python (tf.py_function or '
                     'tf.numpy_function), which a tf.data service worker '
                     'cannot run: drop --tf_data_service')


@contextlib.contextmanager
def _global_seed_unset(unset: bool, global_seed: Optional[int]):
  """With `unset`, TensorFlow's global seed is unset inside (random ops
  built there draw their seeds where they run) and `global_seed` after."""
  if not unset or global_seed is None:
    yield
    return
  tf.random.set_seed(None)
  try:
    yield
  finally:
    tf.random.set_seed(global_seed)


def training_input_fn(cfg, info, replica_batch_size: int, start_step: int):
  """An input fn for distribute_datasets_from_function whose every pipeline
  reads the run's training pipeline (at cfg.image_size) from the service,
  as one job: registered here, once per process, under the job's name."""
  # Here, not at the top: datasets is the local pipelines' module.
  from resnet_keras.data import datasets  # pylint: disable=g-import-not-at-top
  job = job_name(cfg.tf_data_service_job_name, cfg.model_dir, start_step,
                 cfg.image_size)
  # One pipeline over all the data: the service's workers share it out, not
  # the input contexts. Without sharding every data worker runs all of it,
  # so each must shuffle in its own order, or all would serve the same
  # batches: unseeded (the shuffle then draws its seed where it runs), with
  # TensorFlow's global seed (--global_seed) out of the way while it is
  # built. (The first registration of a job's id is the one served.)
  seed = None if cfg.tf_data_service_sharding == 'off' else cfg.global_seed
  train_fn, _ = datasets.make_input_fns(
      dataclasses.replace(cfg, global_seed=seed), info, replica_batch_size)
  with _global_seed_unset(seed is None, cfg.global_seed):
    pipeline = train_fn(tf.distribute.InputContext())
  check_servable(pipeline)
  dataset_id = register(pipeline, cfg.tf_data_service, job)
  return lambda ctx: reader(cfg.tf_data_service, dataset_id,
                            pipeline.element_spec, job,
                            cfg.tf_data_service_sharding)


# -- The servers ----------------------------------------------------------

def start_dispatcher(port: int, work_dir: Optional[str]):
  config = tf.data.experimental.service.DispatcherConfig(
      port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir))
  return tf.data.experimental.service.DispatchServer(config)


def start_worker(port: int, dispatcher: str, worker_address: Optional[str]):
  if not dispatcher:
    raise UsageError('a worker needs --dispatcher HOST:PORT')
  address = dispatcher if '://' in dispatcher else f'{PROTOCOL}://{dispatcher}'
  host, dispatcher_port = parse_address(address, '--dispatcher')
  check_reachable(address, timeout=30)
  config = tf.data.experimental.service.WorkerConfig(
      dispatcher_address=hosts.host_port(host, dispatcher_port), port=port,
      worker_address=(worker_address or hosts.host_port(
          hosts.address_toward(host, dispatcher_port), port)))
  return tf.data.experimental.service.WorkerServer(config), config


def _check_port_free(role: str, port: int) -> None:
  """One line naming the port where TensorFlow's server would fail with a
  traceback ('Could not start gRPC server'), before it starts."""
  family, everywhere = ((socket.AF_INET6, '::') if socket.has_ipv6 and
                        os.path.exists('/proc/net/if_inet6')
                        else (socket.AF_INET, ''))
  with socket.socket(family, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind((everywhere, port))
    except OSError as e:
      raise UsageError(_port_taken(role, port, e.strerror)) from None


def _port_taken(role: str, port: int, why: str) -> str:
  return (f'the tf.data service {role} cannot listen on port {port} '
          f'({why}): stop what holds it (ss -ltnp \'sport = :{port}\' '
          'names it), or give another --port (the launcher\'s '
          '--data_service_port)')


def start_server(role: str, port: int, work_dir: Optional[str],
                 dispatcher: Optional[str], worker_address: Optional[str]):
  """Starts the server of `role` (ROLES) on `port`; returns it and its line
  saying it is ready."""
  _check_port_free(role, port)
  try:
    if role == 'dispatcher':
      server = start_dispatcher(port, work_dir)
      mode = (f'fault tolerant, work_dir {work_dir}' if work_dir
              else 'no work_dir: a restart forgets its jobs')
      address = f'{PROTOCOL}://{socket.gethostname()}:{port}'
      return server, (f'tf.data service dispatcher ready at {address} '
                      f'({mode})')
    server, config = start_worker(port, dispatcher, worker_address)
  except tf.errors.OpError as e:
    raise UsageError(f'the {role} did not start on port {port}: '
                     f'{" ".join(e.message.split())}') from None
  except RuntimeError as e:
    if 'gRPC server' not in str(e):
      raise
    # Taken between the check and the start (TensorFlow says no more).
    raise UsageError(_port_taken(role, port, str(e))) from None
  return server, (f'tf.data service worker ready at {config.worker_address}, '
                  f'serving {config.dispatcher_address}')


def serve_until_signalled(server) -> None:
  """Serves until SIGTERM or SIGINT, then stops the server."""
  stop = threading.Event()
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda *_: stop.set())
  while not stop.wait(1.0):
    pass
  server.stop()
