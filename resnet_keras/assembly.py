"""A run's parts, built from its RunConfig: one chain for training and tools.

Training (run.py) and the tools that rebuild a run's model (validate,
average, export) assemble the same parts the same way, so a tool computes
as the run did:

  runtime set-up -> data description -> backend -> plan -> schedule ->
  model -> optimizer -> checkpoint manager -> input fns -> trainer

`set_up` is the first three, `assemble_training` and `assemble_evaluation`
the rest; `build_model` is the model alone (export).
"""

import dataclasses
import os
import shutil
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import tensorflow as tf
import tf_keras

from common import distribution
from resnet_keras import checkpoints
from resnet_keras import guards
from resnet_keras import hardware
from resnet_keras import models
from resnet_keras import optimizers
from resnet_keras import runtime
from resnet_keras import schedules
from resnet_keras import trainer as trainer_lib
from resnet_keras import warm_start
from resnet_keras import weight_average as weight_average_lib
from resnet_keras.config import RunConfig, TrainingPlan, make_training_plan
from resnet_keras.data import datasets
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.data import service as data_service


@dataclasses.dataclass(frozen=True)
class Basis:
  """What a process decides before it builds anything of a run."""
  cfg: RunConfig  # dtype decided for this machine
  # cfg with num_classes of the data: what config.json records.
  effective_cfg: RunConfig
  machine: hardware.Machine
  runtime_record: Dict  # config.json's and run_summary.json's 'runtime'
  info: datasets.DatasetInfo
  backend: distribution.Backend


@dataclasses.dataclass
class Parts:
  """A run's model, optimizer, checkpoints and trainer, built for `plan`."""
  plan: TrainingPlan
  schedule: Any  # learning rate as a function of the step
  network: tf_keras.Model  # the classifier that is exported
  model: tf_keras.Model  # what trains: the network, wrapped for its input
  optimizer: Any
  # What this process saves to and restores from; None: it never saves.
  manager: Optional[tf.train.CheckpointManager]
  trainer: trainer_lib.ResnetTrainer
  # --ema_decay's average of the model's weights; None: not averaging.
  weight_average: Optional[weight_average_lib.WeightAverage] = None
  # Counts the records --skip_corrupt_records skipped; None: not counting.
  skipped: Optional[imagenet.SkippedRecords] = None
  guard: Optional[guards.LoopGuard] = None  # training only
  # (image_size, data_start) -> the distributed training input at that size,
  # from the batch after `data_start` batches of the run's data; training
  # only (progressive resizing replaces the trainer's with it).
  train_input: Optional[Callable[[int, int], Any]] = None
  train_image_size: int = 0  # of the trainer's training input now


def set_up(cfg: RunConfig, distributed: bool = True) -> Basis:
  """The runtime configured for cfg on this machine, its data described and
  its backend built (`distributed` False: this process alone, as the tools
  run)."""
  cfg, machine, runtime_record = runtime.set_up(cfg)
  # The backend before anything runs a TensorFlow op: multi_worker_mirrored
  # configures collectives, which TensorFlow allows only before its context
  # starts (describe reads the TFRecords).
  backend = (distribution.build_backend(cfg.distribution_strategy,
                                        cfg.num_gpus, cfg.use_horovod)
             if distributed else
             distribution.Backend(tf.distribute.get_strategy()))
  info = datasets.describe(cfg)
  return Basis(cfg=cfg,
               effective_cfg=dataclasses.replace(
                   cfg, num_classes=info.num_classes),
               machine=machine, runtime_record=runtime_record, info=info,
               backend=backend)


def plan_for(basis: Basis) -> TrainingPlan:
  """The run's steps and batch sizes on this job's layout."""
  return make_training_plan(
      basis.cfg, basis.info.num_train_examples, basis.info.num_eval_examples,
      num_programs=basis.backend.num_programs,
      replicas_per_program=basis.backend.strategy.num_replicas_in_sync)


def build_model(cfg: RunConfig, num_classes: int, machine: hardware.Machine,
                weight_decay_path: str = 'none', hvd: Any = None
                ) -> Tuple[tf_keras.Model, tf_keras.Model]:
  """(network, model) of a run; per-layer regularisers only where they
  apply the run's weight decay (they hold no variables)."""
  return models.build_models(
      cfg, num_classes, use_regularizers=weight_decay_path == 'regularizers',
      machine=machine, hvd=hvd)


def init_stem_from_training_images(cfg: RunConfig, info: datasets.DatasetInfo,
                                   network: tf_keras.Model) -> None:
  """--stem_init=pca: the stem's filters from patches of the first training
  images in file order, preprocessed as evaluation does at the training
  size; the same images on every worker (Horovod's then take the chief's
  weights anyway)."""
  kernel_size = network.get_layer(models.STEM_CONV).kernel.shape[0]
  count = models.pca_image_count(cfg.image_size, kernel_size)
  sized = dataclasses.replace(cfg, eval_image_size=cfg.image_size)
  pixels, _ = next(iter(datasets.pixel_batches(
      sized, info, count, from_training=True, limit=count)))
  used, filters, held = models.init_stem_from_images(
      network, normalize_images(pixels))
  logging.info('stem: %d of its %d filters start as +/- the %d principal '
               'directions of %dx%d patches of %d training images (%.1f%% '
               'of their variance)', 2 * used, filters, used, kernel_size,
               kernel_size, int(pixels.shape[0]), 100 * held)


def build_optimizer(cfg: RunConfig, plan: TrainingPlan) -> Tuple[Any, Any]:
  """(schedule, optimizer) of the run `plan` describes."""
  schedule = schedules.schedule_for_run(cfg, plan.global_batch_size,
                                        plan.steps_per_epoch,
                                        plan.total_train_steps)
  return schedule, optimizers.build_optimizer(cfg, schedule)


def build_weight_average(cfg: RunConfig, model: tf_keras.Model
                         ) -> Optional[weight_average_lib.WeightAverage]:
  """--ema_decay's average of `model`'s variables (None without it), under
  the strategy scope the model was built in."""
  if not cfg.ema_decay:
    return None
  return weight_average_lib.WeightAverage(model.variables, cfg.ema_decay,
                                          cfg.ema_warmup)


def assemble_training(basis: Basis, plan: TrainingPlan) -> Parts:
  """Every part a training process needs, under its backend's strategy.

  Its training input starts where the run's data left off (exact resume
  with --global_seed); model_dir must already be prepared, as the chief's
  checkpoint manager lives there.
  """
  cfg, backend = basis.cfg, basis.backend
  strategy = backend.strategy
  wd_path = optimizers.weight_decay_path(cfg)
  with strategy.scope():
    network, model = build_model(cfg, basis.info.num_classes, basis.machine,
                                 wd_path, backend.hvd)
    schedule, optimizer = build_optimizer(cfg, plan)
    optimizers.create_slots(optimizer, model.trainable_variables)
    averaged = build_weight_average(cfg, model)
    manager = _training_manager(cfg, backend, model, optimizer, averaged)

  skipped = datasets.skipped_records_counter(cfg)
  options = distribution.input_options(cfg.experimental_preloading,
                                       basis.machine.has_gpu)

  if cfg.tf_data_service:  # Before anything waits on it.
    data_service.check_reachable(cfg.tf_data_service,
                                 cfg.tf_data_service_timeout)

  def train_input(image_size: int, data_start: int):
    sized = dataclasses.replace(cfg, image_size=image_size)
    if cfg.tf_data_service:
      return strategy.distribute_datasets_from_function(
          data_service.training_input_fn(sized, basis.info,
                                         plan.replica_batch_size, data_start),
          options)
    train_fn, _ = datasets.make_input_fns(
        sized, basis.info, plan.replica_batch_size, skipped,
        start_step=data_start)
    return strategy.distribute_datasets_from_function(
        lambda ctx: train_fn(backend.input_context(ctx)), options)

  # The size of the epoch the run resumes in (a warm start's is set later).
  train_image_size = schedules.image_size_for_run(
      cfg, checkpoints.latest_step(cfg.model_dir) // plan.steps_per_epoch)
  _, eval_fn = datasets.make_input_fns(cfg, basis.info,
                                       plan.replica_batch_size, skipped)
  eval_ds = (None if cfg.skip_eval else
             strategy.distribute_datasets_from_function(
                 lambda ctx: eval_fn(backend.input_context(ctx)), options))
  guard = guards.LoopGuard(
      get_loop=lambda: trainer.last_loop, any_worker=backend.any_worker,
      last_checkpoint=lambda: manager and manager.latest_checkpoint,
      dtype=cfg.dtype)
  trainer = trainer_lib.ResnetTrainer(
      strategy=strategy, model=model, optimizer=optimizer,
      train_dataset=train_input(
          train_image_size, warm_start.steps_of_data_read(cfg.model_dir)),
      eval_dataset=eval_ds,
      program_batch_size=plan.program_batch_size,
      global_batch_size=plan.global_batch_size,
      num_classes=basis.info.num_classes,
      max_steps_per_loop=plan.steps_per_loop,
      label_smoothing=cfg.label_smoothing, weight_decay=cfg.weight_decay,
      weight_decay_path=wd_path, use_tf_function=cfg.use_tf_function,
      use_tf_while_loop=cfg.use_tf_while_loop,
      num_accumulation_steps=cfg.num_accumulation_steps,
      eval_flip=cfg.eval_flip, weight_average=averaged, backend=backend,
      stop_requested=guard.stop_requested)
  return Parts(plan=plan, schedule=schedule, network=network, model=model,
               optimizer=optimizer, manager=manager, trainer=trainer,
               weight_average=averaged, skipped=skipped, guard=guard,
               train_input=train_input, train_image_size=train_image_size)


def assemble_evaluation(basis: Basis, plan: TrainingPlan) -> Parts:
  """A recorded run's model and optimizer (schedule included, so a
  checkpoint written from them restores in training like the run's) and an
  evaluator of its validation data, batches of --batch_size, in this process.

  The manager reads model_dir's checkpoints; the input reads the data as the
  run's evaluations did (with its --skip_corrupt_records).
  """
  cfg = basis.cfg
  network, model = build_model(cfg, basis.info.num_classes, basis.machine)
  schedule, optimizer = build_optimizer(cfg, plan)
  averaged = build_weight_average(cfg, model)
  manager = checkpoints.make_manager(model, optimizer, cfg.model_dir,
                                     weight_average=averaged)
  skipped = datasets.skipped_records_counter(cfg)
  _, eval_fn = datasets.make_input_fns(cfg, basis.info, cfg.batch_size,
                                       skipped)
  strategy = basis.backend.strategy
  evaluator = trainer_lib.ResnetTrainer(
      strategy=strategy, model=model, optimizer=optimizer,
      train_dataset=None,
      eval_dataset=strategy.distribute_datasets_from_function(eval_fn),
      program_batch_size=cfg.batch_size, num_classes=basis.info.num_classes,
      max_steps_per_loop=1, use_tf_function=cfg.use_tf_function,
      eval_flip=cfg.eval_flip, weight_average=averaged)
  return Parts(plan=plan, schedule=schedule, network=network, model=model,
               optimizer=optimizer, manager=manager, trainer=evaluator,
               weight_average=averaged, skipped=skipped)


def _training_manager(cfg: RunConfig, backend: distribution.Backend,
                      model, optimizer, averaged
                      ) -> Optional[tf.train.CheckpointManager]:
  """The manager this worker saves with (None: it never saves).

  The chief's lives in model_dir, and the orbit Controller restores from it.
  Other tf.distribute workers take part in every save, into a scratch
  manager in their worker_dir, and restore model_dir's latest checkpoint
  themselves (model_dir must be shared). Other Horovod workers take the
  chief's variables by broadcast instead.
  """
  if backend.is_chief:
    return checkpoints.make_manager(model, optimizer, cfg.model_dir,
                                    max_to_keep=cfg.max_checkpoints,
                                    weight_average=averaged)
  if not backend.collective_saves:
    return None
  scratch = os.path.join(backend.worker_dir(cfg.model_dir), 'checkpoints')
  shutil.rmtree(scratch, ignore_errors=True)
  manager = checkpoints.make_manager(model, optimizer, scratch, max_to_keep=1,
                                     weight_average=averaged)
  latest = tf.train.latest_checkpoint(cfg.model_dir)
  if latest:
    manager.checkpoint.restore(latest)
  return manager
