"""Distribution backends: one interface over tf.distribute and Horovod.

The training loop asks a `Backend` "am I the chief?", "how is input
sharded?", "sum this over the workers", "sync these variables from the
chief"; it never branches on Horovod vs tf.distribute itself.

Batch semantics follow the reference: `--batch_size` is the global batch
under tf.distribute (one program drives every replica) and the per-worker
batch under Horovod (every process is a worker with its own program).
"""

import collections
import contextlib
import dataclasses
import functools
import os
import socket
import sys
import threading
import time
from typing import (Any, Callable, ContextManager, Iterator, List, Optional,
                    Sequence, Tuple)

from absl import logging
import numpy as np
import tensorflow as tf
from official.common import distribute_utils
from tensorflow.python.eager import context

from common import hosts
from common import worker_contract
from common.batch_rule import BatchRule
from common.errors import UsageError


# Seconds the workers wait for each other at the end of a run when the
# launcher set no wait on the others (worker_contract.collective_timeout).
_LEAVE_TIMEOUT = worker_contract.stuck_rank_timeout(
    worker_contract.DEFAULT_FAILURE_TIMEOUT)


class Progress:
  """When this worker last saw the job's collectives move on, while it is
  inside them: `waiting(phase)` around code that waits on the other
  workers, `beat()` each time they answered (the training loop's stop poll,
  before each step; each evaluation step). A watchdog polls `current`
  (resnet_keras/training/watchdog.py), and derives how long a wait may last from
  what each phase's waits took so far: the times between its beats
  (`intervals`) and the lengths of its waits without any (`lengths`).
  With a `stall` rule (seconds of an interval beyond the usual, given the
  phase's earlier ones) it adds up each phase's time stalled (goodput).
  Thread-safe; cheap enough to call every step."""

  # A phase's recent step times kept: enough for a high percentile, few
  # enough that a job whose steps slow down gets its deadline in minutes.
  WINDOW = 200

  def __init__(self, joining_watch: Optional[
      Callable[[], ContextManager[None]]] = None,
               stall: Optional[Callable[[float, Sequence[float]],
                                        float]] = None):
    self._lock = threading.Lock()
    self._depth = 0
    self._last = 0.0
    self._phase = ''
    self._beats = 0
    self._entered = 0.0
    self._intervals = collections.defaultdict(
        lambda: collections.deque(maxlen=self.WINDOW))
    self._lengths = collections.defaultdict(
        lambda: collections.deque(maxlen=self.WINDOW))
    self._stall = stall
    self._stalled = collections.defaultdict(float)
    self._joining_watch = joining_watch

  @contextlib.contextmanager
  def joining(self) -> Iterator[None]:
    """Around the wait for every worker to join (hvd.init(), starting
    multi_worker_mirrored): waiting, and watched from outside this process
    where it was given a `joining_watch` (resnet_keras/training/watchdog.py)."""
    outside = (self._joining_watch() if self._joining_watch else
               contextlib.nullcontext())
    with outside, self.waiting('joining'):
      yield

  @contextlib.contextmanager
  def waiting(self, phase: str = 'other') -> Iterator[None]:
    """A wait on the others; a wait inside another is part of the outer
    one, of its phase."""
    with self._lock:
      self._depth += 1
      if self._depth == 1:
        self._last = self._entered = time.time()
        self._phase, self._beats = phase, 0
    try:
      yield
    finally:
      with self._lock:
        self._depth -= 1
        if not self._depth and not self._beats:
          self._lengths[self._phase].append(time.time() - self._entered)

  def beat(self) -> None:
    with self._lock:
      now = time.time()
      # Before a wait's second beat its time is its own start (tracing, the
      # input filling) and its first step's collective, which waits on what
      # the others did between waits (a Horovod chief's checkpoint): not a
      # step's usual time.
      if self._depth and self._beats >= 2:
        interval, earlier = now - self._last, self._intervals[self._phase]
        if self._stall:
          self._stalled[self._phase] += self._stall(interval, earlier)
        earlier.append(interval)
      self._beats += bool(self._depth)
      self._last = now

  def waiting_since(self) -> float:
    """Wall time of the last answer while waiting; 0 when not waiting."""
    return self._last if self._depth else 0.0

  def current(self) -> Tuple[float, str, int]:
    """(waiting_since, the wait's phase, its beats so far)."""
    with self._lock:
      return ((self._last, self._phase, self._beats) if self._depth else
              (0.0, '', 0))

  def intervals(self, phase: str) -> List[float]:
    """The latest WINDOW times between two beats of `phase`'s waits."""
    with self._lock:
      return list(self._intervals[phase])

  def lengths(self, phase: str) -> List[float]:
    """The latest WINDOW lengths of `phase`'s waits that had no beat."""
    with self._lock:
      return list(self._lengths[phase])

  def stalled(self, phase: str) -> float:
    """Seconds `phase`'s steps stalled so far, by the `stall` rule; with the
    wait in progress too, if it is of `phase` and past its last beat."""
    with self._lock:
      total = self._stalled[phase]
      if self._stall and self._depth and self._beats >= 2 and \
          self._phase == phase:
        total += self._stall(time.time() - self._last,
                             self._intervals[phase])
      return total


class WorkerCollectives:
  """What the workers compute together outside the training step: sums,
  counts and flags over every worker, the chief's values to all, each
  collective waited on in `progress`. Mixed into Backend, whose `strategy`,
  `hvd`, `worker_index`, `num_workers` and `progress` it reads; every
  worker must call each of these, in the same order."""

  def sum_over_workers(self, value, name: str):
    """A tensor summed over Horovod workers, as numpy (tf.distribute
    reductions already span every worker). Every worker must call this in
    the same order with the same `name`."""
    if self.hvd:
      value = self._horovod_sum(value, name)
    return value.numpy()

  def _horovod_sum(self, value, name: str):
    # Horovod op names may not contain ':' (variable names do).
    return self.hvd.allreduce(value, op=self.hvd.Sum,
                              name=name.replace(':', '_'))

  def count_workers(self, flags, name: str):
    """Per element of the bool tensor `flags`, how many workers have it set.
    A collective that every worker must call, eagerly or in a tf.function."""
    counts = tf.cast(flags, tf.int32)
    if self.hvd:
      return self._horovod_sum(counts, name)
    if self.num_workers > 1:
      return self.strategy.reduce('SUM', self.strategy.run(lambda: counts),
                                  axis=None)
    return counts

  def each_worker(self, value: float) -> np.ndarray:
    """Every worker's `value` (float32), by worker index: a collective every
    worker must call, once per loop at most (its own alone in a job of
    one)."""
    if self.num_workers == 1:
      return np.array([value], np.float32)
    with self.progress.waiting():
      return self._each_worker(tf.constant(value, tf.float32)).numpy()

  @functools.cached_property
  def _each_worker(self):

    def gather(value):
      # Each adds its value at its own index: the sum holds every one.
      own = tf.one_hot(self.worker_index, self.num_workers) * value
      if self.hvd:
        return self._horovod_sum(own, 'each_worker')
      # Each of a worker's replicas added it.
      local = self.strategy.num_replicas_in_sync // self.num_workers
      return self.strategy.reduce('SUM', self.strategy.run(lambda: own),
                                  axis=None) / local

    return tf.function(gather, autograph=False)

  def any_worker(self, *flags: bool) -> Tuple[bool, ...]:
    """Per flag, True if it is true on any worker: one collective for all
    of them, which every worker must call."""
    with self.progress.waiting():
      counts = self._count_flags(tf.constant(flags)).numpy()
    return tuple(bool(count > 0) for count in counts)

  def wait_for_all(self) -> None:
    """Returns once every worker has called it (a collective)."""
    if self.num_workers > 1:
      self.any_worker(False)

  @functools.cached_property
  def _count_flags(self):
    # Called eagerly (after every loop), strategy.run under
    # MultiWorkerMirroredStrategy sets its replicas up again each time, and
    # TensorFlow logs a warning about it; traced once, it is one collective.
    return tf.function(lambda flags: self.count_workers(flags, 'any_worker'),
                       autograph=False)

  def sum_metrics_over_workers(self, metrics) -> None:
    """Horovod: each worker evaluated its own shard; summing the metrics'
    totals and counts weights every worker by its number of examples.
    (tf.distribute metrics already aggregate over every replica.)"""
    if not self.hvd:
      return
    with self.progress.waiting():
      for metric in metrics:
        for variable in metric.variables:
          variable.assign(self.sum_over_workers(
              variable.value(), f'{metric.name}_{variable.name}'))

  def sync_from_chief(self, variables) -> None:
    """Horovod: every worker takes the chief's values (fresh init or the
    checkpoint only the chief restored)."""
    if self.hvd:
      with self.progress.waiting():
        self.hvd.broadcast_variables(variables, root_rank=0)


@dataclasses.dataclass
class Backend(WorkerCollectives):
  """The strategy a process builds its model under, and its place in the job.

  Attributes:
    strategy: replicas driven by this program (Horovod: the default strategy).
    worker_index: this process among `num_workers` (tf.distribute: task id).
    num_workers: processes training together.
    hvd: the horovod.tensorflow module under --use_horovod, else None.
  """
  strategy: tf.distribute.Strategy
  worker_index: int = 0
  num_workers: int = 1
  hvd: Any = None
  progress: Progress = dataclasses.field(default_factory=Progress)

  @property
  def is_chief(self) -> bool:
    return self.worker_index == 0

  @property
  def name(self) -> str:
    return 'horovod' if self.hvd else 'tf.distribute'

  @property
  def collective_saves(self) -> bool:
    """tf.distribute multi-worker: every worker must take part in saving
    (reading some variables is a collective); non-chiefs save to their own
    folder of model_dir. Horovod workers hold plain variables: only the chief saves."""
    return not self.hvd and self.num_workers > 1

  def saving(self) -> ContextManager[None]:
    """Around the part of a save every worker takes part in where saves
    are collective (`collective_saves`: it waits on the others); a Horovod
    chief saves alone, however long it takes."""
    if self.collective_saves:
      return self.progress.waiting('checkpoints')
    return contextlib.nullcontext()

  @property
  def num_programs(self) -> int:
    """Processes that each drive their own replicas: every Horovod worker;
    a tf.distribute job is one program (its strategy spans the workers)."""
    return BatchRule(self.num_workers, bool(self.hvd)).programs

  def input_context(self, ctx: tf.distribute.InputContext
                   ) -> tf.distribute.InputContext:
    """The strategy's input context widened to every Horovod worker."""
    if not self.hvd:
      return ctx
    return tf.distribute.InputContext(
        num_input_pipelines=ctx.num_input_pipelines * self.num_workers,
        input_pipeline_id=(self.worker_index * ctx.num_input_pipelines +
                           ctx.input_pipeline_id),
        num_replicas_in_sync=ctx.num_replicas_in_sync)

  def gradient_tape(self, tape: tf.GradientTape):
    """A tape whose gradients are averaged over Horovod workers."""
    return self.hvd.DistributedGradientTape(tape) if self.hvd else tape

  def allreduce_gradients(self, grads):
    """Gradients averaged over Horovod workers, as `gradient_tape` would;
    for gradients summed before the all-reduce (accumulation). tf.distribute
    all-reduces inside `apply_gradients` instead."""
    if not self.hvd:
      return grads
    return self.hvd.grouped_allreduce(grads, op=self.hvd.Average)

  def leave(self) -> None:
    """The end of a successful run, after its last write.

    multi_worker_mirrored: the chief's process hosts the coordination
    service the other workers poll; when it exits first, they log failed
    RPCs after a good run. So every worker waits here for all the others,
    then the others leave at once and the chief last.
    """
    if self.hvd or self.num_workers == 1:
      return
    timeout = worker_contract.collective_timeout(os.environ) or _LEAVE_TIMEOUT
    context.context().wait_at_barrier('resnet_keras_leave',
                                      int(timeout * 1000))
    if not self.is_chief:
      logging.flush()
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(0)  # Nothing left to write; skips TensorFlow's teardown.


def build_backend(name: str, num_gpus: int = -1, use_horovod: bool = False,
                  progress: Optional[Progress] = None) -> Backend:
  """The backend `--distribution_strategy`/`--use_horovod` ask for.

  `mirrored` on a machine without GPUs whose CPU was split into logical
  devices (--num_cpu_replicas) replicates over those. `progress` (the
  backend's from then on) waits while the workers join: hvd.init() and
  multi_worker_mirrored's start wait for every worker, for good if one
  was frozen before it got there.
  """
  progress = progress or Progress()
  if use_horovod:
    return _horovod_backend(progress)
  # Only here: listing devices starts TensorFlow's runtime, and
  # multi_worker_mirrored must configure its collectives before that.
  cpus = tf.config.list_logical_devices('CPU') if name == 'mirrored' else ()
  if len(cpus) > 1:
    return Backend(tf.distribute.MirroredStrategy(
        devices=[cpu.name for cpu in cpus]), progress=progress)
  if name == 'multi_worker_mirrored':
    _ensure_tf_config()
    _check_own_address(os.environ)
  gpus = len(tf.config.list_physical_devices('GPU'))
  if num_gpus < 0:
    num_gpus = gpus
  if num_gpus > gpus:
    raise UsageError(f'--num_gpus={num_gpus} but only {gpus} GPU(s) are '
                     'visible; lower --num_gpus')
  if name == 'multi_worker_mirrored':
    # No timeout on the collectives themselves: TensorFlow holds a thread
    # for each collective op until its timeout passes, so a worker's
    # threads grow with the steps (5,900 after 40 s of a tiny model at 10
    # steps/s with 120 s; its threads ran out at ~10,000 and it aborted).
    # A worker stuck or frozen is the watchdog's
    # (resnet_keras/training/watchdog.py).
    with progress.joining():
      strategy = tf.distribute.MultiWorkerMirroredStrategy()
  else:
    strategy = distribute_utils.get_distribution_strategy(
        distribution_strategy=name, num_gpus=num_gpus)
  strategy = strategy or tf.distribute.get_strategy()
  worker_index, num_workers = 0, 1
  resolver = getattr(strategy, 'cluster_resolver', None)
  if name == 'multi_worker_mirrored' and resolver is not None:
    worker_index = resolver.task_id or 0
    num_workers = len(resolver.cluster_spec().as_dict().get('worker', [1]))
  return Backend(strategy, worker_index, num_workers, progress=progress)


def _ensure_tf_config() -> None:
  """Sets TF_CONFIG from the MPI rank when the launcher started us via
  mpirun and none is set; a TF_CONFIG the user set is used as is."""
  tf_config = worker_contract.ensure_tf_config(os.environ)
  if tf_config:
    logging.info('TF_CONFIG from the MPI rank: %s', tf_config)


def _check_own_address(environ) -> None:
  """Every address of TF_CONFIG readable, and this task's one this host
  can listen at, before TensorFlow starts its server: at an address it
  cannot read (an IPv6 one without brackets) or that is not this host's,
  it starts it and then waits for good, deaf to SIGTERM."""
  kind, index, host, port = worker_contract.tf_config_task(environ)
  where = f'{kind} {index} of TF_CONFIG ({hosts.host_port(host, port)})'
  try:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
  except socket.gaierror as e:
    raise UsageError(f'{where}: {host} has no address ({e.strerror}); give '
                     'this host\'s own name or address for its task') from None
  if all(_bind_error(family, (address[0], 0, *address[2:]))
         for family, _, _, _, address in infos):
    raise UsageError(f'{where}: {host} is not an address of this host, so '
                     'this worker cannot listen there; give this host\'s own '
                     'name or address for its task')
  # TensorFlow listens on every interface, IPv6's too where there is one.
  any_address = ((socket.AF_INET6, ('::', port)) if socket.has_ipv6 and
                 os.path.exists('/proc/net/if_inet6')
                 else (socket.AF_INET, ('', port)))
  busy = _bind_error(*any_address, reuse=True)
  if busy:
    raise UsageError(
        f'{where}: port {port} is not free ({busy}); stop what holds it, or '
        'choose other ports (TF_BASE_PORT for the launcher, or TF_CONFIG)')


def _bind_error(family, address, reuse: bool = False) -> Optional[str]:
  """Why a TCP socket cannot bind `address` (None: it can)."""
  with socket.socket(family, socket.SOCK_STREAM) as probe:
    if reuse:  # A port left in TIME_WAIT is free to a server.
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(address)
    except OSError as e:
      return e.strerror or str(e)
  return None


def _horovod_backend(progress: Progress) -> Backend:
  try:
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UsageError(f'--use_horovod needs Horovod ({e}); install it with '
                     'scripts/install_horovod.sh') from None
  gpus = tf.config.list_physical_devices('GPU')
  for name, value in horovod_defaults(bool(gpus)).items():
    os.environ.setdefault(name, value)  # Read by hvd.init().
  with progress.joining():
    hvd.init()
  gpu = gpu_for_local_rank(gpus, hvd.local_rank(), hvd.local_size())
  if gpu is not None:
    # As the reference programs do: memory as needed, not all of it at once.
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, 'GPU')
  return Backend(tf.distribute.get_strategy(), hvd.rank(), hvd.size(), hvd,
                 progress=progress)


# Horovod's background thread negotiates every HOROVOD_CYCLE_TIME ms
# (default 1): at 1 ms, whichever rank waits for the other's next cycle
# busy-polls in MPI_Allreduce, about a core whether training or idle
# (benchmarks/horovod_idle.py), a core a CPU host's kernels lose. At 10 ms:
# 2 workers on a 2-core Zen 4, Fashion-MNIST's quick start, epoch 2:
# 1,466-1,625 -> 1,802-1,917 img/s, 25% less CPU; a CPU step lasts far
# longer than the added wait. GPU hosts keep Horovod's default.
CPU_CYCLE_TIME_MS = 10


def horovod_defaults(has_gpu: bool) -> dict:
  """Horovod settings a worker uses unless its environment sets them."""
  return {} if has_gpu else {'HOROVOD_CYCLE_TIME': str(CPU_CYCLE_TIME_MS)}


def gpu_for_local_rank(gpus: Sequence[Any], local_rank: int,
                       local_size: int) -> Optional[Any]:
  """The GPU of the Horovod process with this rank on its host (None on a
  host without GPUs): one GPU per process, never shared."""
  if not gpus:
    return None
  if local_size > len(gpus):
    raise UsageError(f'{local_size} Horovod processes on this host but '
                     f'{len(gpus)} GPU(s): each process needs a GPU of its '
                     f'own; start at most {len(gpus)} workers per host '
                     '(--num_workers_per_hls)')
  return gpus[local_rank]


def input_options(preloading: bool, has_gpu: bool
                  ) -> tf.distribute.InputOptions:
  """What distribute_datasets_from_function is asked for: with
  --experimental_preloading on an accelerator, each replica's next batches
  are fetched into device memory while the current step runs."""
  return tf.distribute.InputOptions(
      experimental_fetch_to_device=preloading and has_gpu,
      experimental_per_replica_buffer_size=2)
