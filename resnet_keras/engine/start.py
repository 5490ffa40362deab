"""Where a run starts: decided once (`decide`), then restored (`restore`).

A run starts in one of three ways:

  fresh    model_dir has no checkpoint and no warm start is asked for: the
           initial weights (with --stem_init=pca, the stem's filters fitted
           to the first training images), step 0.
  resumed  model_dir has a checkpoint: its model, optimizer (step, slots,
           loss scale) and weight average; the data goes on after the
           batches the run has read (exact resume with --global_seed). The
           newest checkpoint that reads: one that does not (a write cut
           short) is passed over with a line naming it, never deleted.
  warm     model_dir has no checkpoint and --restore_from or
           --pretrained_checkpoint names another run's:
             --restore_from PATH [--restore_optimizer]   the same model
             --pretrained_checkpoint PATH [--freeze_backbone]   its backbone,
                                                          a new head
           PATH is a checkpoint prefix (DIR/ckpt-8) or a run's model_dir (its
           latest). The config.json beside the checkpoint says what model it
           holds, so a mismatch is refused in one line naming both models
           before anything runs. --restore_optimizer also restores the
           optimizer, so the schedule goes on from that step.
           --pretrained_checkpoint needs the same architecture but not the
           same classes: the checkpoint is restored into a model built from
           its own config, and every layer but the head is copied by name.

`decide` reads model_dir (and the source checkpoint) and returns a `Start`:
nothing else reads the checkpoint directory to decide how a run begins.
The training loop, the input (where its data goes on) and the weight
average take that answer. A warm start is recorded in
model_dir/warm_start.json: once its own model_dir has a checkpoint, a rerun
resumes from that, and a run that began at a restored step S has read
(step - S) batches of its data at a later step, which is what its exact
resume skips. When the job's shape changed on the way (world.py), the
examples each shape read say where the data goes on. The chief writes
what `decide` reads next time (config.json, world_sizes.json) with
`write_run_files` as the run begins.

`restore` is the run's one restore: its own checkpoint, a warm start's
source (through checkpoints.restore, which restores one checkpoint
strictly, for the tools too), or the PCA stem; then the weight average.
"""

import dataclasses
import json
import os
from typing import Optional

import tensorflow as tf
import tf_keras
from absl import logging

from resnet_keras.engine import distribution
from resnet_keras import files
from common.errors import UsageError
from resnet_keras.files import write_json_atomically
from resnet_keras.rundir import checkpoints
from resnet_keras.model import network as network_lib
from resnet_keras.rundir import run_directory
from resnet_keras.model import stem_init
from resnet_keras.engine import world
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.config.plan import TrainingPlan

FRESH, RESUMED, WARM = 'fresh', 'resumed', 'warm'
RESTORE_FLAG = '--restore_from'
PRETRAINED_FLAG = '--pretrained_checkpoint'


@dataclasses.dataclass(frozen=True)
class Source:
  """The checkpoint a warm start takes, and the run that wrote it."""
  flag: str
  checkpoint: str
  cfg: RunConfig


@dataclasses.dataclass(frozen=True)
class Start:
  """What a run starts from (see the module doc)."""
  kind: str  # FRESH, RESUMED or WARM
  step: int  # the optimizer step training goes on from
  # Batches of this run's own data read before `step`: where its input
  # goes on (less than `step` after a warm start at a restored step).
  batches_read: int = 0
  checkpoint: Optional[str] = None  # restored: model_dir's, or the source's
  source: Optional[Source] = None  # WARM only
  # --stem_init=pca: the stem is fitted to training images (FRESH only).
  fit_stem: bool = False
  # The weight average goes on from the checkpoint's (RESUMED with one);
  # otherwise it starts as the weights the run starts from.
  resumes_ema: bool = False

  def batches_read_at(self, step: int) -> int:
    """Batches of this run's data read by the time training reaches
    `step`: the input of that step starts after them."""
    return self.batches_read + step - self.step


def decide(cfg: RunConfig, plan: TrainingPlan) -> Start:
  """Where the run `cfg` (the effective config: classes resolved) starts.

  Refuses, in one line, a model_dir whose checkpoints belong to another
  model, a warm-start source of another model, and a restored step at or
  past the end of the plan.
  """
  _check_run_files(cfg.model_dir)
  world.read(cfg.model_dir)  # A damaged record stops here, before any write.
  latest, own = checkpoints.latest(cfg.model_dir)
  flag, path = ((RESTORE_FLAG, cfg.restore_from) if cfg.restore_from else
                (PRETRAINED_FLAG, cfg.pretrained_checkpoint))
  if latest:
    checkpoints.check_resumable(cfg.model_dir, cfg)
    _check_resume_goes_on(cfg, plan, own)
    if path:
      logging.info('%s ignored: --model_dir=%s has its own checkpoint (step '
                   '%d) and resumes from it', flag, cfg.model_dir, own)
    return Start(RESUMED, own,
                 batches_read=_batches_read(cfg.model_dir, own,
                                            plan.global_batch_size),
                 checkpoint=latest,
                 resumes_ema=(bool(cfg.ema_decay) and
                              checkpoints.has_ema(latest)))
  if not path:
    return Start(FRESH, 0, fit_stem=cfg.stem_init == 'pca')
  source = resolve_source(cfg, flag, path)
  step = (checkpoints.step_of(source.checkpoint)
          if cfg.restore_optimizer else 0)
  if step >= plan.total_train_steps:
    raise UsageError(
        f'--restore_optimizer restored step {step}, but this run has '
        f'only {plan.total_train_steps} steps, so it would train nothing; '
        'raise --train_epochs, or drop --restore_optimizer to start at step 0')
  return Start(WARM, step, checkpoint=source.checkpoint, source=source)


# The files a run writes whole at its top level (a write replaces each).
_RUN_FILES = (run_directory.CONFIG_FILE, run_directory.WORLD_FILE,
              run_directory.SCHEDULER_FILE, run_directory.WARM_START_FILE,
              run_directory.GOODPUT_FILE, run_directory.METRICS_FILE,
              run_directory.SUMMARY_FILE)


def _check_run_files(model_dir: str) -> None:
  """Refuses, before any work, a folder (or anything but a file) where the
  run writes one of its files: the write would fail after the training."""
  for name in _RUN_FILES:
    path = os.path.join(model_dir, name)
    if os.path.lexists(path) and not os.path.isfile(path):
      raise UsageError(f'{path} {files.kind_of(path)}, where the run writes a '
                       'file of that name; move it away, or choose another '
                       '--model_dir')


def _check_resume_goes_on(cfg: RunConfig, plan: TrainingPlan,
                          own: int) -> None:
  """Refuses a resume that cannot be the run it goes on with.

  Another --optimizer: a resume is the saved run going on (exactly, with
  --global_seed), and the checkpoint's optimizer state (momentum, moment
  estimates, LARS's or LAMB's) is half of that run; restored into another
  optimizer it would be dropped without a word, and config.json would then
  describe steps no optimizer took. Changing optimizers is a new run from
  these weights, which --restore_from is, with its own record of where it
  began (warm_start.json). Other optimizer flags (learning rate, momentum,
  decay) keep the state's meaning and may change on a resume.

  A checkpoint past the plan's end: a step cannot be untrained, so no run
  of fewer steps can come of it; training "to" an earlier step would only
  evaluate and export the longer run under the shorter one's name. The
  plan's end itself is allowed: that run finishes what it had left (its
  export and summary, `run._train`).
  """
  saved = (checkpoints.read_config(cfg.model_dir)[0] if os.path.exists(
      os.path.join(cfg.model_dir, run_directory.CONFIG_FILE)) else cfg)
  if saved.optimizer != cfg.optimizer:
    raise UsageError(
        f'--model_dir={cfg.model_dir} holds a run trained with --optimizer='
        f'{saved.optimizer} (to step {own}); resuming it with --optimizer='
        f'{cfg.optimizer} would drop its optimizer state: rerun with '
        f'--optimizer={saved.optimizer} to resume, or start a new run from '
        f'its weights in another --model_dir with --restore_from='
        f'{cfg.model_dir}')
  if own > plan.total_train_steps:
    raise UsageError(
        f'--model_dir={cfg.model_dir} is trained to step {own}, past the end '
        f'of this run ({plan.total_train_steps} steps: --train_epochs='
        f'{cfg.train_epochs} of {plan.steps_per_epoch}); a checkpoint cannot '
        'be trained back: ask for at least as many steps to resume it, or '
        'use another --model_dir (or --clean) to train a shorter run')


def check_announced(start: Start, announced: Optional[int],
                    model_dir: str) -> None:
  """Stops a restarted attempt whose start is not the checkpoint the
  launcher announced (`announced`: its step, 0 for none; None: not a
  restart), rather than train from another step than the log says."""
  own = start.step if start.kind == RESUMED else 0
  if announced is None or own == announced:
    return
  named = run_directory.latest_checkpoint(model_dir)
  if named and named.step == announced:
    return  # The same model_dir; its latest does not read (said above).
  found = f'its checkpoint at step {own}' if own else 'no checkpoint'
  raise UsageError(
      f'the launcher restarted this job to resume at step {announced}, but '
      f'the chief finds {found} in --model_dir={model_dir}: the launcher and '
      'the chief must see the same model_dir (storage every host shares); '
      'stopped rather than train from another step')


def resolve_source(cfg: RunConfig, flag: str, path: str) -> Source:
  """The checkpoint `flag`=`path` names, if it holds a model this run can
  start from."""
  prefix = checkpoint_prefix(flag, path)
  try:
    checkpoints.check_readable(prefix)
    source_cfg, _ = checkpoints.read_config(os.path.dirname(prefix))
  except UsageError as e:
    raise UsageError(f'{flag}={path}: {e}') from None
  saved, wanted = (checkpoints.describe_identity(compared_identity(flag, c))
                   for c in (source_cfg, cfg))
  if saved != wanted:
    raise UsageError(f'{flag}={path} holds another model ({saved}; this run: '
                     f'{wanted})')
  return Source(flag, prefix, source_cfg)


def checkpoint_prefix(flag: str, path: str) -> str:
  """`path` as a checkpoint prefix: itself, or a directory's latest."""
  if os.path.isdir(path):
    latest = run_directory.latest_checkpoint(path)
    if not latest:
      raise UsageError(f'{flag}={path} is a directory without checkpoints; '
                       'name a run\'s model_dir or one of its checkpoints')
    return latest.prefix
  if not os.path.exists(path + '.index'):
    raise UsageError(f'{flag}={path} is neither a directory nor a checkpoint '
                     f'(no {path}.index)')
  return path


def compared_identity(flag: str, cfg: RunConfig) -> dict:
  """What the source must share with this run: the whole model to restore
  it, the architecture (not the classes) to take its backbone."""
  identity = checkpoints.model_identity(cfg)
  if flag == PRETRAINED_FLAG:
    del identity['num_classes']
  return identity


def write_run_files(start: Start, cfg: RunConfig, plan: TrainingPlan,
                    runtime_record: dict, shape: dict) -> None:
  """The chief writes in model_dir what `decide` reads at the next start:
  config.json (`cfg`, the plan and the machine: what the checkpoints are
  of) and the job's `shape` (world.py) from the step this attempt starts
  at; a run's first shape starts where its own data began (a run resumed
  from before world_sizes.json existed had one shape so far)."""
  checkpoints.record_config(cfg.model_dir, cfg, plan, runtime_record)
  first = not world.read(cfg.model_dir)
  world.record(cfg.model_dir, {**shape, 'step': (
      start.step - start.batches_read if first else start.step)})


def _batches_read(model_dir: str, step: int, global_batch: int) -> int:
  """Batches of `global_batch` examples model_dir's run has drawn from its
  own data by `step`: the examples its recorded shapes read (world.py), or
  without that record, the step less the step a warm start began at."""
  examples = world.examples_read(world.read(model_dir), step)
  if examples is not None:
    return examples // global_batch
  path = os.path.join(model_dir, run_directory.WARM_START_FILE)
  if not os.path.exists(path):
    return step
  try:
    with open(path) as f:
      began = json.load(f)['step']
    if not isinstance(began, int) or not 0 <= began <= step:
      raise ValueError(f'"step" {began!r}, not a step up to {step}')
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UsageError(
        f'{path} is damaged ({e!r}): it records the step a warm start began '
        'at, from which a resume finds where its data goes on; restore it, '
        'or delete it to resume as a run that began at step 0') from None
  return step - began


@dataclasses.dataclass
class Weights:
  """What `restore` loads into: a run's objects, as assembly built them."""
  network: tf_keras.Model  # the classifier (a warm start's backbone)
  model: tf_keras.Model  # what trains
  optimizer: object
  # The checkpoint this worker restores into (None: it takes the chief's
  # variables by broadcast instead).
  checkpoint: Optional[tf.train.Checkpoint]
  ema: object = None  # --ema_decay's, or None


def restore(start: Start, weights: Weights, cfg: RunConfig,
            info: datasets.DatasetInfo,
            backend: distribution.Backend) -> None:
  """Loads what `start` says into `weights`, and gives every worker the
  chief's variables. The first step of a run, after it is assembled."""
  if start.kind == RESUMED and weights.checkpoint is not None:
    _restore_own(start, weights.checkpoint, cfg, backend)
  elif start.kind == WARM:
    load_source(start.source, weights.network, weights.model,
                weights.optimizer, cfg.restore_optimizer)
  elif start.fit_stem:
    stem_init.init_stem_from_training_images(cfg, info, weights.network)
  ema = weights.ema
  if ema:
    _start_ema(ema, start)
  backend.sync_from_chief(
      weights.model.variables + weights.optimizer.variables() +
      (ema.averages if ema else []))
  if start.kind == WARM and backend.is_chief:
    write_json_atomically(os.path.join(cfg.model_dir,
                                       run_directory.WARM_START_FILE),
                          {'flag': start.source.flag,
                           'checkpoint': start.source.checkpoint,
                           'step': start.step})
  if start.kind == RESUMED and backend.is_chief:
    logging.info('restored from %s at step %d', start.checkpoint, start.step)


def _restore_own(start: Start, checkpoint: tf.train.Checkpoint,
                 cfg: RunConfig, backend: distribution.Backend) -> None:
  try:
    with backend.strategy.scope():
      checkpoint.restore(start.checkpoint)
  except (ValueError, tf.errors.InvalidArgumentError) as e:
    raise UsageError(
        f'--model_dir={cfg.model_dir} holds a checkpoint this model cannot '
        f'restore ({str(e).splitlines()[0][:200]}); use another --model_dir, '
        'or --clean to delete it and start over') from None


def load_source(source: Source, network, model, optimizer,
                restore_optimizer: bool) -> None:
  """Loads a warm start's `source` into this run's (network, training
  model, optimizer)."""
  if source.flag == PRETRAINED_FLAG:
    _load_backbone(source, network)
    logging.info('%s: backbone from %s (%d classes); new %d-class head',
                 source.flag, source.checkpoint, source.cfg.num_classes,
                 network.output_shape[-1])
    return
  objects = {'model': model}
  if restore_optimizer:
    objects['optimizer'] = optimizer
  checkpoints.restore(tf.train.Checkpoint(**objects), source.checkpoint,
                      source.cfg)
  logging.info('%s: started from %s (%s, step %d)', source.flag,
               source.checkpoint,
               'weights and optimizer' if restore_optimizer else 'weights only',
               int(optimizer.iterations.numpy()))


def _load_backbone(source: Source, network) -> None:
  source_network, source_model = network_lib.build_models(
      source.cfg, source.cfg.num_classes, use_regularizers=False,
      pipeline_output=datasets.pipeline_output(source.cfg))
  checkpoints.restore(tf.train.Checkpoint(model=source_model),
                      source.checkpoint, source.cfg)
  for layer in network_lib.backbone_layers(network):
    layer.set_weights(source_network.get_layer(layer.name).get_weights())


def _start_ema(ema, start: Start) -> None:
  """The average goes on from the checkpoint's when the run resumes one
  that holds it; otherwise it starts from the weights the run starts
  from (initial, restored or warm-started)."""
  if start.resumes_ema:
    logging.info('--ema_decay %g: evaluations score the weight average '
                 '(resumed from %s)', ema.decay, start.checkpoint)
    return
  ema.reset()
  logging.info('--ema_decay %g: evaluations score the weight average, '
               'which starts from the %s weights', ema.decay,
               'initial' if start.kind == FRESH else 'restored')
