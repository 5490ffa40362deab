"""A run's parts, built from its RunConfig: one chain for training and tools.

Training (run.py) and the tools that rebuild a run's model (validate,
average, export) assemble the same parts the same way, so a tool computes
as the run did:

  set_up: runtime (runtime.configure) -> backend -> data description
  plan_for: the training plan on this job's layout
  assemble_training (from the run's decided start.Start) or
  assemble_evaluation: schedule -> model -> optimizer -> weight average ->
      checkpoint manager -> input -> objective, step record, trainer,
      evaluator

All of them read the effective config (Basis.effective_cfg). `build_model`
is the model alone (export). Nothing here restores weights or reads the
checkpoint directory to decide anything: start.py decides where a run
starts, and start.restore restores it after assembling.
"""

import dataclasses
import os
import shutil
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.rundir import checkpoints
from resnet_keras.engine import guards
from resnet_keras.config import hardware
from resnet_keras.optimization import lr_schedules
from resnet_keras.data import progressive_resizing
from resnet_keras.model import network as network_lib
from resnet_keras.optimization import optimizers
from resnet_keras.rundir import run_directory
from resnet_keras.engine import runtime
from resnet_keras.engine import start as start_lib
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import imagenet
from resnet_keras.data import input_service
from resnet_keras.engine.evaluator import Evaluator
from resnet_keras.engine.objective import Objective
from resnet_keras.config.plan import TrainingPlan, make_training_plan
from resnet_keras.engine.step_record import StepRecord
from resnet_keras.engine.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class Basis:
  """What a process decides before it builds anything of a run."""
  cfg: RunConfig  # as asked, dtype decided for this machine
  # cfg with num_classes of the data: the config everything after set_up
  # reads, and config.json records (a tool's cfg is one already).
  effective_cfg: RunConfig
  machine: hardware.Machine
  runtime_record: Dict  # config.json's and run_summary.json's 'runtime'
  info: datasets.DatasetInfo
  backend: distribution.Backend


@dataclasses.dataclass
class Parts:
  """A run's model, optimizer, checkpoints, trainer and evaluator."""
  plan: TrainingPlan
  schedule: Any  # learning rate as a function of the step
  network: tf_keras.Model  # the classifier that is exported
  model: tf_keras.Model  # what trains: the network, wrapped for its input
  optimizer: Any
  # What this process saves to and restores from; None: it never saves.
  manager: Optional[tf.train.CheckpointManager]
  evaluator: Optional[Evaluator]  # None: --skip_eval
  saver: Optional[checkpoints.Saver] = None  # training only, its saves
  trainer: Optional[Trainer] = None  # training only
  step_record: Optional[StepRecord] = None  # the trainer's, training only
  # --ema_decay's average of the model's weights; None: not averaging.
  ema: Optional[ema_lib.EMA] = None
  # Counts the records --skip_corrupt_records skipped; None: not counting.
  skipped: Optional[imagenet.SkippedRecords] = None
  guard: Optional[guards.LoopGuard] = None  # training only
  # The trainer's input at each image size; training only.
  training_input: Optional[progressive_resizing.TrainingInput] = None

  def weights(self) -> start_lib.Weights:
    """What start.restore loads into."""
    return start_lib.Weights(
        network=self.network, model=self.model, optimizer=self.optimizer,
        checkpoint=self.manager and self.manager.checkpoint,
        ema=self.ema)


def set_up(cfg: RunConfig, distributed: bool = True,
           progress: Optional[distribution.Progress] = None) -> Basis:
  """The runtime configured for cfg on this machine, its backend built and
  its data described (`distributed` False: this process alone, as the
  tools run). `progress`: the backend's, already watched while the workers
  join (run.py)."""
  cfg, machine, runtime_record = runtime.configure(cfg)
  # The backend before anything runs a TensorFlow op: multi_worker_mirrored
  # configures collectives, which TensorFlow allows only before its context
  # starts (describe reads the TFRecords).
  backend = (distribution.build_backend(cfg.distribution_strategy,
                                        cfg.num_gpus, cfg.use_horovod,
                                        progress)
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
      basis.effective_cfg, basis.info.num_train_examples,
      basis.info.num_eval_examples,
      num_programs=basis.backend.num_programs,
      replicas_per_program=basis.backend.strategy.num_replicas_in_sync)


def build_model(cfg: RunConfig, num_classes: int, machine: hardware.Machine,
                weight_decay_path: str = 'none', hvd: Any = None
                ) -> Tuple[tf_keras.Model, tf_keras.Model]:
  """(network, model) of a run; per-layer regularisers only where they
  apply the run's weight decay (they hold no variables)."""
  return network_lib.build_models(
      cfg, num_classes, use_regularizers=weight_decay_path == 'regularizers',
      pipeline_output=datasets.pipeline_output(cfg), machine=machine, hvd=hvd)


def build_optimizer(cfg: RunConfig, plan: TrainingPlan) -> Tuple[Any, Any]:
  """(schedule, optimizer) of the run `plan` describes."""
  schedule = lr_schedules.schedule_for_run(
      cfg, plan.schedule_batch_size, plan.steps_per_epoch,
      plan.total_train_steps, scale=plan.lr_scale)
  return schedule, optimizers.build_optimizer(cfg, schedule)


def build_ema(cfg: RunConfig, model: tf_keras.Model
                         ) -> Optional[ema_lib.EMA]:
  """--ema_decay's average of `model`'s variables (None without it), under
  the strategy scope the model was built in."""
  if not cfg.ema_decay:
    return None
  return ema_lib.EMA(model.variables, cfg.ema_decay,
                                          cfg.ema_warmup)


def assemble_training(basis: Basis, plan: TrainingPlan,
                      start: start_lib.Start) -> Parts:
  """Every part a training process needs, under its backend's strategy.

  Its training input starts where `start` says the run's data goes on
  (exact resume with --global_seed), at the size of the epoch it starts
  in; model_dir must already be prepared, as the chief's checkpoint
  manager lives there.
  """
  cfg, backend = basis.effective_cfg, basis.backend
  strategy = backend.strategy
  wd_path = optimizers.weight_decay_path(cfg)
  with strategy.scope():
    network, model = build_model(cfg, basis.info.num_classes, basis.machine,
                                 wd_path, backend.hvd)
    # --loss=bce trains on the logits; evaluation and exports keep the
    # softmax of `model` and `network`.
    logits_model = (
        network_lib.build_logits_model(cfg, network,
                                       datasets.pipeline_output(cfg))
        if cfg.loss == 'bce' else None)
    schedule, optimizer = build_optimizer(cfg, plan)
    optimizers.create_slots(optimizer, model.trainable_variables)
    ema = build_ema(cfg, model)
    manager = _training_manager(cfg, backend, model, optimizer, ema)

  skipped = datasets.skipped_records_counter(cfg)
  options = distribution.input_options(cfg.experimental_preloading,
                                       basis.machine.has_gpu)
  if cfg.tf_data_service:  # Before anything waits on it.
    input_service.check_reachable(cfg.tf_data_service,
                                  cfg.tf_data_service_timeout)

  def train_input(image_size: int, data_start: int):
    sized = dataclasses.replace(cfg, image_size=image_size)
    if cfg.tf_data_service:
      return strategy.distribute_datasets_from_function(
          input_service.training_input_fn(sized, basis.info,
                                         plan.replica_batch_size, data_start),
          options)
    train_fn, _ = datasets.make_input_fns(
        sized, basis.info, plan.replica_batch_size, skipped,
        start_step=data_start)
    return strategy.distribute_datasets_from_function(
        lambda ctx: train_fn(backend.input_context(ctx)), options)

  # The evaluation input before the training input, whose seeds
  # (--global_seed) follow TensorFlow's count of the ops made before it.
  evaluator = None if cfg.skip_eval else _evaluator(
      basis, model, plan.replica_batch_size, ema, skipped, options)
  objective = Objective(
      model=model, optimizer=optimizer, backend=backend,
      num_classes=basis.info.num_classes,
      program_batch_size=plan.program_batch_size,
      label_smoothing=cfg.label_smoothing, weight_decay=cfg.weight_decay,
      weight_decay_path=wd_path,
      num_accumulation_steps=cfg.num_accumulation_steps, loss=cfg.loss,
      bce_target_threshold=cfg.bce_target_threshold,
      logits_model=logits_model,
      drop_path_seed=cfg.global_seed if cfg.drop_path_rate else None)
  step_record = StepRecord(optimizer.iterations, plan.steps_per_loop,
                           with_loss_scales=objective.uses_loss_scale)
  guard = guards.LoopGuard(
      any_worker=backend.any_worker,
      last_checkpoint=lambda: manager and manager.latest_checkpoint,
      dtype=cfg.dtype, stopped_early=step_record.stopped_early)
  training_input = progressive_resizing.TrainingInput(
      cfg, plan.steps_per_epoch, train_input, start.step)
  trainer = Trainer(
      objective=objective, step_record=step_record,
      train_dataset=train_input(training_input.size, start.batches_read),
      global_batch_size=plan.global_batch_size, backend=backend,
      weights_finite=guards.finite_check(model.variables),
      ema=ema,
      stop_poll=guards.stop_poll(guard.stop_requested, backend),
      use_tf_function=cfg.use_tf_function,
      use_tf_while_loop=cfg.use_tf_while_loop)
  return Parts(plan=plan, schedule=schedule, network=network, model=model,
               optimizer=optimizer, manager=manager, evaluator=evaluator,
               saver=checkpoints.Saver(
                   manager, backend,
                   resumed_at=(start.step if start.kind == start_lib.RESUMED
                               else None)), trainer=trainer,
               step_record=step_record, ema=ema, skipped=skipped,
               guard=guard, training_input=training_input)


def assemble_evaluation(basis: Basis, plan: TrainingPlan) -> Parts:
  """A recorded run's model and optimizer (schedule included, so a
  checkpoint written from them restores in training like the run's) and an
  evaluator of its validation data, batches of --batch_size, in this process.

  The manager reads model_dir's checkpoints; the input reads the data as the
  run's evaluations did (with its --skip_corrupt_records).
  """
  cfg = basis.effective_cfg
  network, model = build_model(cfg, basis.info.num_classes, basis.machine)
  schedule, optimizer = build_optimizer(cfg, plan)
  ema = build_ema(cfg, model)
  manager = checkpoints.make_manager(model, optimizer, cfg.model_dir,
                                     ema=ema)
  skipped = datasets.skipped_records_counter(cfg)
  return Parts(plan=plan, schedule=schedule, network=network, model=model,
               optimizer=optimizer, manager=manager,
               evaluator=_evaluator(basis, model, cfg.batch_size, ema,
                                    skipped),
               ema=ema, skipped=skipped)


def _evaluator(basis: Basis, model: tf_keras.Model, replica_batch_size: int,
               ema, skipped, options=None) -> Evaluator:
  """The evaluator of the run's validation data, read as its evaluations
  read it, in batches of `replica_batch_size` per replica."""
  cfg, backend = basis.effective_cfg, basis.backend
  _, eval_fn = datasets.make_input_fns(cfg, basis.info, replica_batch_size,
                                       skipped)
  return Evaluator(
      model=model, num_classes=basis.info.num_classes, backend=backend,
      eval_dataset=backend.strategy.distribute_datasets_from_function(
          lambda ctx: eval_fn(backend.input_context(ctx)), options),
      eval_flip=cfg.eval_flip, ema=ema,
      use_tf_function=cfg.use_tf_function)


def _training_manager(cfg: RunConfig, backend: distribution.Backend,
                      model, optimizer, ema
                      ) -> Optional[tf.train.CheckpointManager]:
  """The manager this worker saves with (None: it never saves).

  The chief's lives in model_dir. Other tf.distribute workers take part in
  every save, into a scratch manager in their own folder of model_dir
  (run_directory.worker_dir), and restore model_dir's checkpoint into it:
  model_dir must be shared. Other Horovod workers take the chief's
  variables by broadcast instead.
  """
  if backend.is_chief:
    return checkpoints.make_manager(model, optimizer, cfg.model_dir,
                                    max_to_keep=cfg.max_checkpoints,
                                    ema=ema)
  if not backend.collective_saves:
    return None
  scratch = os.path.join(
      run_directory.worker_dir(cfg.model_dir, backend.worker_index),
      run_directory.WORKER_CHECKPOINTS_DIR)
  shutil.rmtree(scratch, ignore_errors=True)
  return checkpoints.make_manager(model, optimizer, scratch, max_to_keep=1,
                                  ema=ema)
