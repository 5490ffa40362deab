"""Checkpoints in model_dir: what they hold, what they are of, and reading
them back.

The model and the optimizer (slots, iteration count, loss scale), and the
weight average of --ema_decay, are saved together, so a rerun with the same
model_dir continues at the saved step with the same optimizer state,
learning-rate position and average (start.py decides that it resumes).
config.json says what they are checkpoints of: a run refuses another
model's checkpoints, and the tools rebuild the model and its data from it.
When a run saves is the plan's (plan.TrainingPlan.is_checkpoint_step: epoch
ends, --checkpoint_interval_steps, the end), the clock's
(training/timed_saves.py) and a stop signal's (training/run.py);
how, `Saver`'s: the values copied while the loop waits, written beside it.
`values` reads a model's weights as a checkpoint holds them (the export
reads them so).
"""

import contextlib
import dataclasses
import glob
import json
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_keras import config as config_lib
from resnet_keras.config import options
from resnet_keras.rundir import run_directory
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan
from common.errors import UsageError
from resnet_keras.files import write_json_atomically

MAX_TO_KEEP = RunConfig.max_checkpoints


def make_manager(model, optimizer, model_dir: str,
                 max_to_keep: int = MAX_TO_KEEP,
                 ema=None) -> tf.train.CheckpointManager:
  """A manager of model_dir's checkpoints; the run names each by its step
  (ckpt-<step>)."""
  checkpoint = checkpoint_of(model, optimizer, ema)
  return tf.train.CheckpointManager(
      checkpoint, directory=model_dir, max_to_keep=max_to_keep,
      step_counter=optimizer.iterations,
      checkpoint_name=run_directory.CHECKPOINT_PREFIX)


@dataclasses.dataclass
class _Write:
  """A save's write: what its log line says."""
  step: int
  why: str  # ' after signal', or ''
  blocked: float = 0.0  # seconds the loop waited for the save
  handed_over: float = 0.0  # time.monotonic() when the writer got it


class Saver:
  """A training process's saves with `manager` (None: it never saves),
  written in the background: the loop waits while the checkpoint's values
  are copied to host memory (and, first, for the previous write, if it is
  still going); a thread writes the copy (TensorFlow's own asynchronous
  checkpoint, CheckpointOptions(enable_async=True)). The manager names a
  checkpoint in the state file, and removes the oldest, only once the
  checkpoint's files are complete: a crash while writing leaves the one
  before the newest that reads (`latest`). The copies stay in host memory
  for the next save: as much again as the checkpoint's size.

  `backend`: where every worker takes part in a save (its `saving`), the
  copy is what they do together (batch-norm statistics are read as their
  mean over the workers); each writes its own copy, alone.
  """

  def __init__(self, manager: Optional[tf.train.CheckpointManager], backend,
               resumed_at: Optional[int] = None):
    self._manager = manager
    self._backend = backend
    self._pending: Optional[_Write] = None  # the write in flight
    # The newest step this process knows is saved: its last save, or the
    # checkpoint it resumed from (`resumed_at`).
    self.saved_step: Optional[int] = resumed_at
    self.saved_at: Optional[float] = None  # its hand-over (monotonic)
    self.last_write_seconds = 0.0  # the last write done, in the background
    # Held while a save hands its write over: a write done before its save
    # returned waits here for the moment it began.
    self._handing_over = threading.Lock()

  @property
  def saves(self) -> bool:
    return self._manager is not None

  def save(self, step: int, attempt, why: str = '') -> float:
    """Saves the checkpoint of `step`, the loop's wait timed in `attempt`
    (goodput.Attempt) as checkpoint time, the write's own time beside it;
    its log line once it is written. `why`: said after the step. Returns
    the seconds the loop was blocked. A step saved already (a stop right
    after this loop's save, or before a resumed run's first step) is not
    written again: every worker knows the same steps saved, so where all
    take part in a save all skip it together."""
    if step == self.saved_step:
      return 0.0
    began = time.monotonic()
    self.wait(attempt)
    write = _Write(step, why)
    options = tf.train.CheckpointOptions(
        enable_async=True,
        experimental_write_callbacks=[
            lambda path: self._written(write, attempt, path)])
    with self._handing_over:
      with attempt.timing('checkpoints'), self._backend.saving():
        self._manager.save(checkpoint_number=step, options=options)
      _copy_eagerly(self._manager.checkpoint)
      write.handed_over = time.monotonic()
      write.blocked = write.handed_over - began
      self._pending = write
      self.saved_step, self.saved_at = step, write.handed_over
    return write.blocked

  def _written(self, write: _Write, attempt, path: str) -> None:
    # The writer's thread, the files complete; the manager's update of the
    # state file follows.
    with self._handing_over:
      seconds = time.monotonic() - write.handed_over
    self.last_write_seconds = seconds
    attempt.checkpoint_written(seconds)
    logging.info('saved checkpoint at step %d%s (%s): training blocked '
                 '%.2f s, written in %.2f s in the background', write.step,
                 write.why, path, write.blocked, seconds)

  def wait(self, attempt) -> bool:
    """Returns once the write in flight is complete (whether one was, its
    wait timed in `attempt` as checkpoint time); raises its error where it
    failed."""
    if self._pending is None:
      return False
    with attempt.timing('checkpoints'):
      self._manager.sync()
    self._pending = None
    # TensorFlow keeps a failed write's error (its callbacks' too) for the
    # next save, or for the process's exit, where it is a traceback after
    # the run's last line: sync() does not raise it.
    helper = self._manager.checkpoint._async_checkpointer()  # pylint: disable=protected-access
    helper._check_async_thread_error()  # pylint: disable=protected-access
    return True

  @contextlib.contextmanager
  def waited_at_end(self, attempt):
    """The block's end waits for the write in flight: a run's end (after
    its export), and an error's or a stop's, whose rerun resumes from it.
    A failed write's error is raised at the run's end; after another error,
    logged."""
    try:
      yield
    except BaseException:
      try:
        waited = self.wait(attempt)
      except Exception as e:  # pylint: disable=broad-except
        logging.error('the checkpoint being written failed: %s', e)
        waited = True
      if waited:  # The stop's record was written before this wait.
        attempt.write()
      raise
    self.wait(attempt)


def _copy_eagerly(checkpoint: tf.train.Checkpoint) -> None:
  """From its second save on, TensorFlow's asynchronous checkpoint copies
  the values to host memory in a tf.function: tracing it stopped training
  once per process for 11.5 s (one ResNet-50 process; 53 s for two
  multi_worker_mirrored workers on a loaded machine), and every restart
  pays it again. The copy its first save makes op by op is fast enough
  (the same process: 0.07-0.3 s a save), so every save copies that way;
  but where a variable is read as its mean over the replicas (batch-norm
  statistics under tf.distribute), op by op is an all-reduce for each
  (106 for a ResNet-50: two multi_worker_mirrored workers' saves blocked
  0.86-0.90 s, 1.6-2.3 s on a loaded machine), so from the second save on
  those are read in one (`_means_over_replicas`: 0.13-0.23 s)."""
  helper = checkpoint._async_checkpointer()  # pylint: disable=protected-access
  if '_copy_to_cpu' in vars(helper):
    return
  def copy():
    copies = helper._object_map  # pylint: disable=protected-access
    trackables = helper._saveable_trackables  # pylint: disable=protected-access
    # Copies that do not exist yet are TensorFlow's to make (at the first
    # save), as it makes them.
    means = [t for t in trackables if t in copies and _read_as_mean(t)]
    for trackable, value in zip(means, _means_over_replicas(means)):
      copies[trackable].assign(value)
    done = {id(t) for t in means}
    for trackable in trackables:
      if id(trackable) in done:
        continue
      try:
        trackable._copy_trackable_to_cpu(object_map=copies)  # pylint: disable=protected-access
      except NotImplementedError:
        pass  # Holds no values of its own (TensorFlow passes it over too).
  helper._copy_to_cpu = copy  # pylint: disable=protected-access


def values(variables: List[tf.Variable]) -> List[np.ndarray]:
  """`variables`' values as a checkpoint holds them (what tf_keras's
  get_weights gives, in its order); under tf.distribute a collective that
  every worker joins, in the same order. Those read as their replicas'
  mean are read in one all-reduce per dtype (`_means_over_replicas`), not
  one each: the final export read a ResNet-50's 106 that way."""
  means = [v for v in variables if _read_as_mean(v)]
  read = {id(v): mean for v, mean in zip(means, _means_over_replicas(means))}
  return [read.get(id(v), v).numpy() for v in variables]


def _read_as_mean(trackable) -> bool:
  """A variable of a tf.distribute strategy whose value outside a replica
  is its replicas' mean (TensorFlow reads it with an all-reduce)."""
  return (isinstance(trackable, tf.distribute.DistributedValues) and
          trackable.synchronization == tf.VariableSynchronization.ON_READ and
          trackable.aggregation == tf.VariableAggregation.MEAN)


def _means_over_replicas(variables: List[tf.Variable]) -> List[tf.Tensor]:
  """Each of `variables`' mean over the replicas (the value a read outside
  a replica gives), with one all-reduce per dtype: TensorFlow packs
  all-reduces in a tf.function but not eagerly, and an eager one costs
  its set-up whatever its size."""
  if not variables:
    return []
  strategy = variables[0].distribute_strategy
  means = {}
  # In one order on every worker: they run the same collectives.
  for dtype in dict.fromkeys(v.dtype for v in variables):
    group = [v for v in variables if v.dtype == dtype]
    # This worker's replicas' values, each replica's packed in one tensor.
    packed = [tf.concat([tf.reshape(value, [-1]) for value in values], 0)
              for values in zip(*(strategy.experimental_local_results(v)
                                  for v in group))]
    mean = strategy.reduce(
        tf.distribute.ReduceOp.MEAN,
        strategy.experimental_distribute_values_from_function(
            lambda context: packed[  # pylint: disable=cell-var-from-loop
                context.replica_id_in_sync_group % len(packed)]),
        axis=None)
    parts = tf.split(mean, [v.shape.num_elements() for v in group])
    means.update((id(v), tf.reshape(part, v.shape))
                 for v, part in zip(group, parts))
  return [means[id(v)] for v in variables]


def latest(model_dir: str) -> Tuple[Optional[str], int]:
  """model_dir's newest checkpoint that reads, and its step ((None, 0):
  none). Each newer one that does not read is said in one line and left
  as it is."""
  for found in run_directory.kept_checkpoints(model_dir):
    why = unreadable(found.prefix)
    if not why:
      return found.prefix, found.step
    logging.error('%s; left as it is, and passed over: the run resumes '
                  'from the newest checkpoint that reads (a save at step %d '
                  'would replace it: copy it away to keep it)', why,
                  found.step)
  return None, 0


def unreadable(prefix: str) -> Optional[str]:
  """Why the checkpoint at `prefix` does not read ('FILES are unreadable:
  cause'), or None: every value read back, as a restore reads it
  (TensorFlow checks each one's checksum). A write cut short (a crash, a
  full disk) leaves such a checkpoint."""
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except (IndexError, ValueError, tf.errors.OpError) as e:
    files = ', '.join(sorted(glob.glob(glob.escape(prefix) + '.*'))) or prefix
    cause = str(e).strip().splitlines()[0][:200] if str(e).strip() else (
        type(e).__name__)
    return f'the checkpoint {files} is unreadable ({cause})'
  return None


def check_readable(prefix: str) -> None:
  """Refuses, in one line naming its files, a checkpoint that does not read
  (`unreadable`): the tools and a warm start read the one they are given."""
  why = unreadable(prefix)
  if why:
    raise UsageError(f'{why}; name another checkpoint, or train again to '
                     'write a new one')


def checkpoint_of(model, optimizer=None,
                  ema=None) -> tf.train.Checkpoint:
  """What a run's checkpoints hold: the model, its optimizer, and
  --ema_decay's weight average beside them (None: left out)."""
  # 'weight_average': the key checkpoints have held the average under
  # since --ema_decay came (ema.py), kept so that they all restore.
  objects = {'model': model, 'optimizer': optimizer,
             'weight_average': ema and ema.trackable}
  return tf.train.Checkpoint(
      **{k: v for k, v in objects.items() if v is not None})


def step_of(path: str) -> int:
  """The optimizer's iteration count in the checkpoint at `path` (any
  prefix, without building anything).

  Not `latest`'s step, which is read from model_dir's state file and the
  name the run's manager gave (ckpt-<step>): a checkpoint given as a path
  (--restore_from, the export tool's --checkpoint) is any prefix, whose
  name need not hold a step, and what --restore_optimizer goes on from is
  the count the optimizer restores, so this reads the count itself.
  """
  return int(tf.train.load_variable(
      path, 'optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE'))


def has_ema(path: str) -> bool:
  """Whether the checkpoint at `path` holds a weight average (--ema_decay)."""
  return any(name.startswith('weight_average/')
             for name, _ in tf.train.list_variables(path))


def model_identity(cfg: RunConfig) -> Dict:
  """The properties a checkpoint must share with a model to restore into it.

  `cfg.num_classes` must be resolved (the effective config's, not 0).
  """
  identity = {'model': cfg.model_name, 'stem': cfg.stem,
              'num_classes': cfg.num_classes, 'norm': cfg.norm_name}
  if cfg.blurpool:  # Same weights, another function.
    identity['blurpool'] = True
  return identity


def describe_identity(identity: Dict) -> str:
  return ', '.join(f'{k} {v}' for k, v in sorted(identity.items()))


def record_config(model_dir: str, cfg: RunConfig, plan: TrainingPlan,
                  runtime: Optional[Dict] = None) -> None:
  """Writes model_dir/config.json; `cfg` has num_classes and dtype resolved.

  `runtime`: the machine, and what was chosen for it and why
  (runtime.fit_to_hardware).
  """
  record = {'config': dataclasses.asdict(cfg),
            'training_plan': dataclasses.asdict(plan)}
  if runtime:
    record['runtime'] = runtime
  write_json_atomically(os.path.join(model_dir, run_directory.CONFIG_FILE),
                        record)


def read_config(model_dir: str) -> Tuple[RunConfig, TrainingPlan]:
  """The config and plan a run recorded; its model_dir is where it is now."""
  path = os.path.join(model_dir, run_directory.CONFIG_FILE)
  if not os.path.isfile(path):
    raise UsageError(f'{path} does not exist; {model_dir} is not a '
                     'directory a training run wrote (resnet_ctl_imagenet_main'
                     '.py records its config there when it starts)')
  try:
    with open(path) as f:
      saved = json.load(f)
    cfg = config_lib.from_dict(RunConfig, saved['config'])
    plan = config_lib.from_dict(TrainingPlan, saved['training_plan'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UsageError(f'{path} is unreadable ({e!r}); delete it, and the next '
                     'training run in this directory writes it again') from None
  try:  # A file edited or damaged by hand: checked as flags would be.
    options.check_types(cfg)
    options.check_types(plan)
    cfg.check()
  except UsageError as e:
    raise UsageError(f'{path} holds a value no run has: {e}; fix it there '
                     '(or delete the file: the next training run in this '
                     'directory writes it again)') from None
  return dataclasses.replace(cfg, model_dir=model_dir), plan


def check_resumable(model_dir: str, cfg: RunConfig) -> None:
  """Refuses a model_dir whose checkpoints belong to a different model.

  Restoring them would fail on a shape mismatch halfway, or worse, succeed
  partially; and a later save would mix the two runs.
  """
  if not (run_directory.latest_checkpoint(model_dir) and os.path.exists(
      os.path.join(model_dir, run_directory.CONFIG_FILE))):
    return
  saved = model_identity(read_config(model_dir)[0])
  identity = model_identity(cfg)
  if saved != identity:
    raise UsageError(
        f'--model_dir={model_dir} holds checkpoints of another model '
        f'({describe_identity(saved)}; this run: '
        f'{describe_identity(identity)}); use another --model_dir, or --clean '
        'to delete them and start over')


def restore(checkpoint: tf.train.Checkpoint, path: str,
            cfg: RunConfig) -> None:
  """Restores `path` for evaluation; refuses one of another model.

  Every variable that exists must get a value (a checkpoint of another depth
  would otherwise restore partially and evaluate a half-random model);
  optimizer slots, which evaluation never creates, may stay unread.
  """
  try:
    checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
  except (AssertionError, ValueError, tf.errors.OpError) as e:
    # A failed restore leaves pending restorations behind that warn about
    # every variable when collected at exit; this error says it all.
    tf.get_logger().setLevel('ERROR')
    what = describe_identity(model_identity(cfg))
    raise UsageError(
        f'{path} is not a checkpoint of this run\'s model ({what}, from '
        f'{run_directory.CONFIG_FILE}): {str(e).splitlines()[0][:200]}'
    ) from None


def checkpoint_paths(manager: tf.train.CheckpointManager, model_dir: str,
                     which: Optional[str]) -> List[str]:
  """The checkpoints --checkpoint names: one, 'all', or (None) the latest;
  refuses one that does not read (`check_readable`)."""
  kept = list(manager.checkpoints)
  if not kept and which in (None, 'all'):
    raise UsageError(f'{model_dir} has no checkpoints; train with '
                     '--enable_checkpoint_and_export')
  if which is None:
    paths = [manager.latest_checkpoint]
  elif which == 'all':
    paths = kept
  else:
    paths = [path for path in (which, os.path.join(model_dir, which))
             if os.path.exists(path + '.index')][:1]
  for path in paths:
    check_readable(path)
  if paths:
    return paths
  names = ', '.join(os.path.basename(p) for p in kept) or 'none'
  raise UsageError(f'--checkpoint={which} is not a checkpoint (no '
                   f'{which}.index); {model_dir} has: {names}')
