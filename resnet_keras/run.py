"""One training run: config -> data, model, optimizer -> orbit cadence -> outputs.

This module owns *when* things happen: train loops of `steps_per_loop` steps,
evaluation every `epochs_between_evals` epochs (from `eval_offset_epochs`)
and at the end, checkpoints, the target-accuracy stop, export, and the
records of a run in model_dir (config.json, metrics.jsonl, plots/,
run_summary.json). What a step computes is in trainer.py.
"""

import dataclasses
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Dict, Optional

import orbit
import tensorflow as tf
from absl import logging

from common import distribution
from common import launch
from common import supervisor
from resnet_keras import checkpoints
from resnet_keras import export
from resnet_keras import guards
from resnet_keras import metrics
from resnet_keras import models
from resnet_keras import optimizers
from resnet_keras import plots
from resnet_keras import runtime
from resnet_keras import schedules
from resnet_keras import trainer as trainer_lib
from resnet_keras import tracking
from resnet_keras import warm_start
from resnet_keras.config import RunConfig, TrainingPlan, make_training_plan
from resnet_keras.data import datasets
from common.errors import RunStopped, UsageError

# orbit's Controller logs every status twice (log and stdout) as multi-line
# dicts; StepLogger and _evaluate print one line each instead.
orbit.controller._log = logging.debug  # pylint: disable=protected-access

SUMMARY_FILE = 'run_summary.json'


def prepare_model_dir(model_dir: str, clean: bool) -> None:
  """Applies --clean and checks model_dir is a writable directory."""
  if clean and os.path.exists(model_dir):
    logging.info('--clean: removing %s', model_dir)
    shutil.rmtree(model_dir)
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir):
      pass
  except OSError as e:
    raise UsageError(f'--model_dir={model_dir} is not a writable directory '
                     f'({e.strerror}); choose another --model_dir') from None


def _log_flag_notes(cfg: RunConfig, weight_decay_path: str,
                    has_gpu: bool, num_replicas: int) -> None:
  """One line for each flag whose wish this run cannot honour as written."""
  if cfg.sync_batch_norm and num_replicas == 1:
    logging.info('--sync_batch_norm: one replica in the job, whose batch is '
                 'the global batch; nothing to synchronise')
  if cfg.experimental_preloading and not has_gpu:
    logging.info('--experimental_preloading: no accelerator present, batches '
                 'already live in host memory; nothing to preload')
  if cfg.uses_lars and cfg.single_l2_loss_op:
    logging.info('--single_l2_loss_op: with LARS, weight decay is applied '
                 'inside the optimizer (same strength), not as a loss term')
  if cfg.keras_applications_model and weight_decay_path == 'single_l2_loss_op' \
      and not cfg.single_l2_loss_op:
    logging.info('--keras_applications_model has no per-layer regularisers; '
                 'weight decay uses the single L2 term (same gradient)')
  if cfg.use_synthetic_data and (cfg.training_dataset_cache or
                                 cfg.datasets_num_private_threads):
    logging.info('--training_dataset_cache/--datasets_num_private_threads: '
                 'synthetic data is one batch in memory; they apply to files')
  if cfg.loss_scale and cfg.dtype != 'fp16':
    logging.info('--loss_scale only applies to --dtype=fp16; ignored')


class _Profiler:
  """orbit train action: a TensorBoard profile of --profile_steps.

  Actions run between loops, so the window snaps to loop boundaries.
  """

  def __init__(self, start: int, stop: int, logdir: str, global_step):
    self._start, self._stop = start, stop
    self._logdir = logdir
    self._step = global_step
    self._active = False

  def __call__(self, output):
    del output
    step = int(self._step.numpy())
    if not self._active and self._start <= step < self._stop:
      tf.profiler.experimental.start(self._logdir)
      self._active = True
      logging.info('profiler started at step %d (%s)', step, self._logdir)
    elif self._active and step >= self._stop:
      self.finish()

  def finish(self):
    if self._active:
      tf.profiler.experimental.stop()
      self._active = False
      logging.info('profiler stopped at step %d', int(self._step.numpy()))


def _checkpoint_manager(cfg: RunConfig, backend: distribution.Backend,
                        model, optimizer):
  """The manager this worker saves with (None: it never saves).

  The chief's lives in model_dir, and the orbit Controller restores from it.
  Other tf.distribute workers take part in every save, into a scratch
  manager in their worker_dir, and restore model_dir's latest checkpoint
  themselves (model_dir must be shared). Other Horovod workers take the
  chief's variables by broadcast instead.
  """
  if backend.is_chief:
    return checkpoints.make_manager(model, optimizer, cfg.model_dir,
                                    max_to_keep=cfg.max_checkpoints)
  if not backend.collective_saves:
    return None
  scratch = os.path.join(backend.worker_dir(cfg.model_dir), 'checkpoints')
  shutil.rmtree(scratch, ignore_errors=True)
  manager = checkpoints.make_manager(model, optimizer, scratch, max_to_keep=1)
  latest = tf.train.latest_checkpoint(cfg.model_dir)
  if latest:
    manager.checkpoint.restore(latest)
  return manager


def weights_digest(model) -> str:
  """sha256 of the trainable weights: equal on every worker of a job."""
  digest = hashlib.sha256()
  for variable in model.trainable_variables:
    digest.update(variable.numpy().tobytes())
  return digest.hexdigest()


def _log_plan(cfg: RunConfig, plan: TrainingPlan, info, backend,
              replica_batch: int) -> None:
  logging.info(
      'data: %s, %d classes, %d train / %d eval examples', info.name,
      info.num_classes, info.num_train_examples, info.num_eval_examples)
  logging.info(
      'plan: global batch %d on %d worker(s) (%s) x %d replica(s), %d '
      'steps/epoch, %d epochs, %d steps, %d steps per loop, dtype %s, '
      'optimizer %s, schedule %s', plan.global_batch_size, backend.num_workers,
      backend.name, backend.strategy.num_replicas_in_sync,
      plan.steps_per_epoch, cfg.train_epochs, plan.total_train_steps,
      plan.steps_per_loop, cfg.dtype, cfg.optimizer, cfg.lr_schedule)
  if cfg.num_accumulation_steps > 1:
    logging.info('gradient accumulation: %d micro-batches of %d per replica '
                 'per optimizer step', cfg.num_accumulation_steps,
                 replica_batch // cfg.num_accumulation_steps)


def run(cfg: RunConfig) -> Dict:
  """Trains (and evaluates) as `cfg` says; returns the run summary."""
  cfg.validate()
  if cfg.wandb:
    tracking.import_wandb()  # Its absence is a usage error; say so first.
  started = time.time()
  cfg, machine, runtime_record = runtime.set_up(cfg)
  has_gpu = machine.has_gpu
  info = datasets.describe(cfg)
  backend = distribution.build_backend(cfg.distribution_strategy,
                                       cfg.num_gpus, cfg.use_horovod)
  strategy = backend.strategy
  # The config as this run applies it; recorded in model_dir for tools.
  effective_cfg = dataclasses.replace(cfg, num_classes=info.num_classes)
  if backend.is_chief:
    prepare_model_dir(cfg.model_dir, cfg.clean)
    checkpoints.check_resumable(cfg.model_dir, effective_cfg)
  else:
    logging.info('worker %d: logging warnings only; the chief (worker 0) '
                 'logs the run', backend.worker_index)
    logging.set_verbosity(logging.WARNING)
  write_dir = backend.worker_dir(cfg.model_dir)
  start_from = warm_start.resolve(effective_cfg)
  plan = make_training_plan(cfg, info.num_train_examples,
                            info.num_eval_examples,
                            num_workers=backend.batch_multiplier)
  # The batch this program's replicas share (per worker under Horovod).
  program_batch = plan.global_batch_size // backend.batch_multiplier
  if program_batch % strategy.num_replicas_in_sync:
    raise UsageError(
        f'--batch_size={program_batch} is the global batch and must '
        f'be divisible by the {strategy.num_replicas_in_sync} replicas')
  replica_batch = program_batch // strategy.num_replicas_in_sync
  if replica_batch % cfg.num_accumulation_steps:
    raise UsageError(
        f'each replica\'s batch of {replica_batch} cannot be split into '
        f'--num_accumulation_steps={cfg.num_accumulation_steps} equal '
        'micro-batches; use a --batch_size that is a multiple of '
        f'{strategy.num_replicas_in_sync * cfg.num_accumulation_steps}')
  _log_plan(cfg, plan, info, backend, replica_batch)
  wd_path = optimizers.weight_decay_path(cfg)
  _log_flag_notes(cfg, wd_path, has_gpu,
                  strategy.num_replicas_in_sync * backend.batch_multiplier)

  schedule = schedules.schedule_for_run(
      cfg, plan.global_batch_size, plan.steps_per_epoch,
      plan.total_train_steps)
  with strategy.scope():
    network, model = models.build_models(
        cfg, info.num_classes, use_regularizers=wd_path == 'regularizers',
        machine=machine, hvd=backend.hvd)
    optimizer = optimizers.build_optimizer(cfg, schedule)
    optimizers.create_slots(optimizer, model.trainable_variables)
    manager = _checkpoint_manager(cfg, backend, model, optimizer)
  saves = backend.is_chief or backend.collective_saves

  skipped = datasets.skipped_records_counter(cfg)
  train_fn, eval_fn = datasets.make_input_fns(
      cfg, info, program_batch, skipped,
      start_step=warm_start.steps_of_data_read(cfg.model_dir))
  input_options = distribution.input_options(cfg.experimental_preloading,
                                             has_gpu)
  train_ds = strategy.distribute_datasets_from_function(
      lambda ctx: train_fn(backend.input_context(ctx)), input_options)
  eval_ds = (None if cfg.skip_eval else
             strategy.distribute_datasets_from_function(
                 lambda ctx: eval_fn(backend.input_context(ctx)),
                 input_options))
  guard = guards.LoopGuard(
      get_loop=lambda: trainer.last_loop, any_worker=backend.any_worker,
      last_checkpoint=lambda: manager and manager.latest_checkpoint,
      dtype=cfg.dtype)
  trainer = trainer_lib.ResnetTrainer(
      strategy=strategy, model=model, optimizer=optimizer,
      train_dataset=train_ds, eval_dataset=eval_ds,
      global_batch_size=program_batch, num_classes=info.num_classes,
      max_steps_per_loop=plan.steps_per_loop,
      label_smoothing=cfg.label_smoothing, weight_decay=cfg.weight_decay,
      weight_decay_path=wd_path, use_tf_function=cfg.use_tf_function,
      use_tf_while_loop=cfg.use_tf_while_loop,
      num_accumulation_steps=cfg.num_accumulation_steps, backend=backend,
      stop_requested=guard.stop_requested)

  metrics_log = None
  if backend.is_chief:
    metrics_log = metrics.MetricsLog(
        cfg.model_dir,
        mirror=tracking.start_wandb(effective_cfg, plan) if cfg.wandb else None)
  logger = metrics.StepLogger(
      get_loop=lambda: trainer.last_loop, log_steps=cfg.log_steps,
      total_steps=plan.total_train_steps,
      steps_per_epoch=plan.steps_per_epoch,
      global_batch_size=plan.global_batch_size,
      learning_rate_at=lambda step: float(schedule(step).numpy()),
      # mpirun gives every rank a terminal; one bar per rank would garble it.
      progress_bar=sys.stdout.isatty() and backend.num_workers == 1,
      metrics_log=metrics_log)
  actions = [logger, guard]
  profiler = None
  if cfg.profile_steps:
    profiler = _Profiler(*cfg.profile_steps,
                         logdir=os.path.join(cfg.model_dir, 'profile'),
                         global_step=optimizer.iterations)
    actions.append(profiler)
  summary_dir = eval_summary_dir = None
  if cfg.enable_tensorboard and backend.is_chief:
    summary_dir = os.path.join(cfg.model_dir, 'train')
    eval_summary_dir = os.path.join(cfg.model_dir, 'eval')
    metrics.write_hparams(summary_dir, _hparams(cfg, plan))

  try:  # The Controller restores the latest checkpoint.
    controller = orbit.Controller(
        strategy=strategy, trainer=trainer,
        evaluator=None if cfg.skip_eval else trainer,
        global_step=optimizer.iterations, steps_per_loop=plan.steps_per_loop,
        checkpoint_manager=manager if backend.is_chief else None,
        summary_dir=summary_dir,
        eval_summary_dir=eval_summary_dir, train_actions=actions)
  except (ValueError, tf.errors.InvalidArgumentError) as e:
    raise UsageError(
        f'--model_dir={cfg.model_dir} holds a checkpoint this model cannot '
        f'restore ({str(e).splitlines()[0][:200]}); use another --model_dir, '
        'or --clean to delete it and start over') from None
  if start_from:
    warm_start.apply(start_from, network, model, optimizer,
                     cfg.restore_optimizer)
  backend.sync_from_chief(model.variables + optimizer.variables())
  start_step = int(optimizer.iterations.numpy())
  if start_from and start_step >= plan.total_train_steps:
    raise UsageError(
        f'--restore_optimizer restored step {start_step}, but this run has '
        f'only {plan.total_train_steps} steps, so it would train nothing; '
        'raise --train_epochs, or drop --restore_optimizer to start at step 0')
  if start_from and backend.is_chief:
    warm_start.record_start(cfg.model_dir, start_from, start_step)
  if start_step and backend.is_chief and not start_from:
    logging.info('restored from %s at step %d', manager.latest_checkpoint,
                 start_step)

  eval_results, target_reached, seconds_to_target = {}, False, None
  step = start_step
  if backend.is_chief:
    checkpoints.record_config(cfg.model_dir, effective_cfg, plan,
                              runtime_record)
    metrics_log.resume_at(start_step)
  guard.install()
  logging.info('training to step %d; SIGTERM or Ctrl-C: checkpoint after the '
               'current step, then stop', plan.total_train_steps)
  try:
    while step < plan.total_train_steps and not target_reached:
      try:
        controller.train(plan.next_stop(step), checkpoint_at_completion=False)
      except guards.SignalReceived as stop:
        step = int(optimizer.iterations.numpy())
        if saves:
          path = manager.save(checkpoint_number=step)
          logging.info('saved checkpoint at step %d after signal (%s)', step,
                       path)
        raise RunStopped(f'stopped by {stop} at step {step}; rerun the same '
                         'command to resume', stop.exit_code) from None
      step = int(optimizer.iterations.numpy())
      if (cfg.enable_checkpoint_and_export and saves and
          plan.is_checkpoint_step(step)):
        logging.info('saved checkpoint %s',
                     manager.save(checkpoint_number=step))
      if not cfg.skip_eval and plan.is_eval_step(step):
        eval_results = _evaluate(controller, plan, step, metrics_log)
        if _reached(cfg, eval_results):
          target_reached, seconds_to_target = True, time.time() - started
          logging.info('target accuracy %.4f reached at epoch %.2f (%.4f) '
                       'after %.1f s; stopping', cfg.target_accuracy,
                       plan.epoch_of(step), eval_results['eval_accuracy'],
                       seconds_to_target)
    if not cfg.skip_eval and not eval_results:
      eval_results = _evaluate(controller, plan, step, metrics_log)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    if 'label out of range' in e.message:
      raise UsageError(f'a record in --data_dir={cfg.data_dir} has a label '
                       f'outside 1..{info.num_classes}; fix the records or '
                       'their metadata.json, or raise --num_classes') from None
    logging.info('data error (%s); looking for the corrupt file',
                 e.message.strip().splitlines()[0][:200])
    message = datasets.corrupt_data_message(cfg, info)
    if not message:
      raise
    raise UsageError(message) from None
  finally:
    guard.uninstall()
    if profiler:
      profiler.finish()
    logger.close()
    if backend.is_chief:
      _write_plots(cfg.model_dir)
      metrics_log.close()
  if cfg.enable_checkpoint_and_export and backend.is_chief:
    path, = export.export_run(network, cfg, cfg.model_dir)
    logging.info('exported SavedModel to %s', path)
  elif cfg.enable_checkpoint_and_export and saves:
    # Under multi_worker_mirrored reading the weights is a collective (batch
    # norm statistics are averaged when read): the other workers join the
    # chief's read, once, as its export copies them.
    network.get_weights()
  skipped_count = skipped.count if skipped else 0
  if skipped:
    _report_skipped(skipped_count, eval_results, info.num_eval_examples)

  summary = {
      'global_batch_size': plan.global_batch_size,
      'num_replicas': strategy.num_replicas_in_sync * (
          backend.batch_multiplier),
      'num_workers': backend.num_workers,
      'worker_index': backend.worker_index,
      'distribution': backend.name,
      'train_steps': step,
      'steps_per_epoch': plan.steps_per_epoch,
      'epochs_completed': step / plan.steps_per_epoch,
      'resumed_from_step': start_step,
      'train_loss': logger.last_loss,
      'train_accuracy': logger.last_accuracy,
      'eval_loss': eval_results.get('eval_loss'),
      'eval_accuracy': eval_results.get('eval_accuracy'),
      'eval_top5_accuracy': eval_results.get('eval_top5_accuracy'),
      'eval_examples': eval_results.get('eval_examples', 0),
      'avg_exp_per_second': logger.average_examples_per_second,
      'input_wait_fraction': logger.input_wait_fraction,
      'skipped_corrupt_records': skipped_count,
      'dtype': cfg.dtype,
      'optimizer': cfg.optimizer,
      'lr_schedule': cfg.lr_schedule,
      'model': cfg.model_name,
      'num_classes': info.num_classes,
      'dataset': info.name,
      'target_accuracy_reached': target_reached,
      # From the start of this process, data and model setup included.
      'seconds_to_target': seconds_to_target,
      'wall_seconds': time.time() - started,
      # ru_maxrss is in KiB on Linux.
      'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      'weights_sha256': weights_digest(model),
      'runtime': runtime_record,
      'host': launch.this_host(os.environ),
      'restarts': supervisor.restart_count(os.environ),
  }
  os.makedirs(write_dir, exist_ok=True)
  metrics.write_json_atomically(os.path.join(write_dir, SUMMARY_FILE),
                                summary)
  logging.info('run summary: %s', summary)
  backend.leave()
  return summary


def _evaluate(controller: orbit.Controller, plan: TrainingPlan, step: int,
              metrics_log: Optional[metrics.MetricsLog]) -> Dict:
  results = controller.evaluate(steps=-1)
  if metrics_log is not None:
    metrics_log.append({'step': step, 'epoch': plan.epoch_of(step), **results})
  logging.info(
      'eval at step %d (epoch %.2f): accuracy %.4f, top-5 %.4f, loss %.4f '
      'over %d examples', step, plan.epoch_of(step), results['eval_accuracy'],
      results['eval_top5_accuracy'], results['eval_loss'],
      results['eval_examples'])
  if results['eval_examples'] != plan.num_eval_examples:
    logging.warning('evaluated %d examples, expected %d',
                    results['eval_examples'], plan.num_eval_examples)
  return results


def _write_plots(model_dir: str) -> None:
  """Redraws model_dir/plots; never fails the run, metrics.jsonl is kept."""
  try:
    paths = plots.write_plots(model_dir)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('plots not written (%s); metrics.jsonl is complete: '
                    'python -m resnet_keras.plots %s', e, model_dir)
  else:
    logging.info('wrote %d plots to %s', len(paths),
                 os.path.join(model_dir, plots.PLOTS_DIR))


def _report_skipped(undecodable: int, eval_results: Dict,
                    num_eval_examples: int) -> None:
  """The end-of-run account of --skip_corrupt_records."""
  logging.info('--skip_corrupt_records: skipped %d records with undecodable '
               'images (shards with unreadable records were read up to the '
               'bad one; TensorFlow logged each as "Ignoring error")',
               undecodable)
  evaluated = eval_results.get('eval_examples', num_eval_examples)
  if evaluated < num_eval_examples:
    logging.warning('evaluated %d of %d validation examples: %d were '
                    'unreadable and skipped', evaluated, num_eval_examples,
                    num_eval_examples - evaluated)


def _reached(cfg: RunConfig, results: Dict) -> bool:
  return bool(cfg.target_accuracy and
              results['eval_accuracy'] >= cfg.target_accuracy)


def _hparams(cfg: RunConfig, plan: TrainingPlan) -> Dict:
  hparams = {k: v for k, v in vars(cfg).items() if v is not None}
  hparams['global_batch_size'] = plan.global_batch_size
  return hparams
