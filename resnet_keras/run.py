"""One training run: set up -> decide the start -> assemble -> restore ->
loop -> finish.

This module owns *when* things happen: train loops of `steps_per_loop` steps,
evaluation every `epochs_between_evals` epochs (from `eval_offset_epochs`)
and at the end, checkpoints, the target-accuracy stop, export, and the
records of a run in model_dir (config.json, metrics.jsonl, plots/,
run_summary.json). Where a run starts is start.py's decision; what its
parts are, assembly.py's; what a step computes, objective.py's and
trainer.py's; evaluation, evaluator.py's.
"""

import dataclasses
import gc
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, Optional, Tuple

import orbit
import tensorflow as tf
from absl import logging

from common import files
from common import launch
from common import supervisor
from resnet_keras import assembly
from resnet_keras import checkpoints
from resnet_keras import curves
from resnet_keras import guards
from resnet_keras import metrics
from resnet_keras import optimizers
from resnet_keras import run_directory
from resnet_keras import schedules
from resnet_keras import start as start_lib
from resnet_keras import tracking
from resnet_keras import trainer as trainer_lib
from resnet_keras import world
from resnet_keras import ema as ema_lib
from resnet_keras.config import RunConfig
from resnet_keras.plan import TrainingPlan
from resnet_keras.data import datasets
from resnet_keras.data import data_service
from resnet_keras.serving import saved_model
from common.errors import RunStopped, UsageError

# orbit's Controller logs every status twice (log and stdout) as multi-line
# dicts; StepLogger and _evaluate print one line each instead.
orbit.controller._log = logging.debug  # pylint: disable=protected-access

def prepare_model_dir(model_dir: str, clean: bool, restarts: int = 0) -> None:
  """Applies --clean and checks model_dir is a writable directory.

  --clean applies to a launch's first attempt only: a restarted one
  (`restarts` > 0) resumes from the checkpoints the first one wrote.
  """
  if clean and restarts:
    logging.info('--clean: not applied to restart %d of this job, which '
                 'resumes from the last checkpoint in %s', restarts,
                 model_dir)
  elif clean and os.path.exists(model_dir):
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

  Actions run between loops, so the profile covers whole loops: it starts
  at the boundary before the loop that runs step `start` (before the first
  loop, when that one does) and stops at the first boundary at or past
  `stop`. A window between two boundaries is still profiled, not skipped.
  """

  def __init__(self, start: int, stop: int, logdir: str, global_step,
               next_loop_end: Callable[[int], int]):
    self._start, self._stop = start, stop
    self._logdir = logdir
    self._step = global_step
    self._next_loop_end = next_loop_end
    self._active = self._done = False

  def __call__(self, output=None):
    del output
    step = int(self._step.numpy())
    if (not self._active and not self._done and step < self._stop and
        self._next_loop_end(step) > self._start):
      tf.profiler.experimental.start(self._logdir)
      self._active = True
      logging.info('profiler started at step %d (%s)', step, self._logdir)
    elif self._active and step >= self._stop:
      self.finish()

  def finish(self):
    if self._active:
      tf.profiler.experimental.stop()
      self._active, self._done = False, True
      logging.info('profiler stopped at step %d', int(self._step.numpy()))
    elif not self._done:
      logging.warning('--profile_steps=%d,%d: this run trained no step in '
                      'the window (it ended at step %d); no profile written',
                      self._start, self._stop, int(self._step.numpy()))


def weights_digest(model) -> str:
  """sha256 of the trainable weights: equal on every worker of a job."""
  digest = hashlib.sha256()
  for variable in model.trainable_variables:
    digest.update(variable.numpy().tobytes())
  return digest.hexdigest()


def _shape(basis: assembly.Basis, plan: TrainingPlan) -> Dict:
  """The job's shape as world_sizes.json records it (world.py)."""
  workers = basis.backend.num_workers
  return {'workers': workers,
          'hosts': launch.parse_hosts(os.environ.get('MULTI_HLS_IPS')),
          'global_batch_size': plan.global_batch_size,
          'worker_batch_size': plan.global_batch_size // workers,
          'micro_batches': plan.num_micro_batches,
          'lr_scale': plan.lr_scale}


def _log_plan(basis: assembly.Basis, plan: TrainingPlan) -> None:
  cfg, info, backend = basis.cfg, basis.info, basis.backend
  logging.info(
      'data: %s, %d classes, %d train / %d eval examples', info.name,
      info.num_classes, info.num_train_examples, info.num_eval_examples)
  logging.info(
      'plan: global batch %d on %d worker(s) (%s) x %d replica(s), %d '
      'steps/epoch, %d epochs, %d steps, %d steps per loop, dtype %s, '
      'optimizer %s, schedule %s', plan.global_batch_size, backend.num_workers,
      backend.name, plan.replicas_per_program, plan.steps_per_epoch,
      cfg.train_epochs, plan.total_train_steps, plan.steps_per_loop, cfg.dtype,
      cfg.optimizer, cfg.lr_schedule)
  if cfg.progressive_resize_start_size:
    first, last = cfg.resize_epochs
    logging.info('progressive resizing: training at %d px until epoch %d, '
                 'rising to %d px at epoch %d in multiples of %d; evaluation '
                 'at %d px', cfg.progressive_resize_start_size, first,
                 cfg.image_size, last, cfg.resize_multiple, cfg.eval_size)
  if plan.lr_scale != 1:
    logging.info('--planned_global_batch=%d: %d steps/epoch of the planned '
                 'batch, each taking %d examples, the learning rate scaled '
                 'by %.4g', plan.planned_global_batch_size,
                 plan.steps_per_epoch, plan.global_batch_size, plan.lr_scale)
  if plan.num_micro_batches > 1:
    logging.info('gradient accumulation: %d micro-batches of %d per replica '
                 'per optimizer step', plan.num_micro_batches,
                 plan.micro_batch_size)
  _log_flag_notes(cfg, optimizers.weight_decay_path(cfg),
                  basis.machine.has_gpu, plan.num_replicas)


def run(cfg: RunConfig) -> Dict:
  """Trains (and evaluates) as `cfg` says; returns the run summary."""
  try:
    return _run(cfg)
  finally:
    # The run's objects hold its input iterators (and tf.data service
    # clients) in reference cycles that only a garbage collection frees.
    # Freed now they go in 0.2 s; freed by a collection 90 s later, the
    # training iterator's destructor waited 50 s for tf.data's autotuning
    # thread (it did not wake to its cancellation), inside whatever code
    # that collection interrupted. A service client would meanwhile keep
    # calling a dispatcher that may be gone.
    gc.collect()


def _run(cfg: RunConfig) -> Dict:
  """Set up -> decide the start -> assemble -> restore -> loop -> finish."""
  started = time.time()
  basis = _set_up(cfg)
  plan = assembly.plan_for(basis)
  start = start_lib.decide(basis.effective_cfg, plan)
  if basis.backend.is_chief:
    start_lib.check_announced(start, supervisor.resume_step(os.environ),
                              basis.cfg.model_dir)
  _log_plan(basis, plan)
  parts = assembly.assemble_training(basis, plan, start)
  start_lib.restore(start, parts.weights(), basis.cfg, basis.info,
                    basis.backend)
  outcome, logger = _train(basis, parts, start, started)
  return _finish(basis, parts, logger, outcome, start, started)


def _set_up(cfg: RunConfig) -> assembly.Basis:
  """The run's runtime, backend and data; the chief's model_dir prepared."""
  cfg.check()
  if cfg.wandb:
    tracking.import_wandb()  # Its absence is a usage error; say so first.
  basis = assembly.set_up(cfg)
  backend = basis.backend
  if backend.is_chief:
    prepare_model_dir(cfg.model_dir, cfg.clean,
                      supervisor.restart_count(os.environ))
  else:
    logging.info('worker %d: logging warnings only; the chief (worker 0) '
                 'logs the run', backend.worker_index)
    logging.set_verbosity(logging.WARNING)
  return basis


def _train(basis: assembly.Basis, parts: assembly.Parts,
           start: start_lib.Start, started: float
           ) -> Tuple['_Outcome', metrics.StepLogger]:
  """The loops, evaluations and checkpoints of the plan, from `start`
  (restored), with its guards and reports; the outcome and the logger."""
  cfg, backend = basis.cfg, basis.backend
  reporting = _Reporting(basis, parts)
  controller = _controller(parts, reporting)
  if backend.is_chief:
    checkpoints.record_config(cfg.model_dir, basis.effective_cfg, parts.plan,
                              basis.runtime_record)
    start_lib.record_shape(start, cfg.model_dir, _shape(basis, parts.plan))
    reporting.metrics_log.resume_at(start.step)
  parts.guard.install()
  watchdog = data_service.InputWatchdog(
      cfg.tf_data_service_timeout if cfg.tf_data_service else 0,
      parts.step_record.input_waiting_since,
      data_service.end_stalled_run(cfg.tf_data_service)).start()
  logging.info('training to step %d; SIGTERM or Ctrl-C: checkpoint after the '
               'current step, then stop', parts.plan.total_train_steps)
  try:
    if reporting.profiler:
      reporting.profiler()  # the first loop may be the window's
    outcome = _train_and_evaluate(cfg, parts, controller, reporting, start,
                                  started)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    error = _data_error(cfg, basis.info, e)
    if error is None:
      raise
    raise error from None
  finally:
    watchdog.stop()
    parts.guard.uninstall()
    reporting.close()
  return outcome, reporting.logger


def _finish(basis: assembly.Basis, parts: assembly.Parts,
            logger: metrics.StepLogger, outcome: '_Outcome',
            start: start_lib.Start, started: float) -> Dict:
  """Export, the end-of-run reports, run_summary.json; the summary."""
  cfg, backend = basis.cfg, basis.backend
  _export(basis, parts)
  if parts.skipped:
    _report_skipped(parts.skipped.count, outcome.eval_results,
                    basis.info.num_eval_examples)
  summary = _summary(basis, parts, logger, outcome, start, started)
  write_dir = run_directory.worker_dir(cfg.model_dir, backend.worker_index)
  os.makedirs(write_dir, exist_ok=True)
  files.write_json_atomically(
      os.path.join(write_dir, run_directory.SUMMARY_FILE), summary)
  logging.info('run summary: %s', summary)
  backend.leave()
  return summary


class _Reporting:
  """What a run reports as it trains: log lines and throughput (StepLogger),
  metrics.jsonl and plots (the chief), TensorBoard summaries and profile."""

  def __init__(self, basis: assembly.Basis, parts: assembly.Parts):
    cfg, backend, plan = basis.cfg, basis.backend, parts.plan
    self._model_dir = cfg.model_dir
    self._plots = cfg.plots
    self.metrics_log = None
    if backend.is_chief:
      self.metrics_log = metrics.MetricsLog(
          cfg.model_dir, mirror=(tracking.start_wandb(basis.effective_cfg,
                                                      plan)
                                 if cfg.wandb else None))
    self.logger = metrics.StepLogger(
        log_steps=cfg.log_steps,
        total_steps=plan.total_train_steps,
        steps_per_epoch=plan.steps_per_epoch,
        global_batch_size=plan.global_batch_size,
        learning_rate_at=lambda step: float(parts.schedule(step).numpy()),
        # mpirun gives every rank a terminal; one bar per rank would garble it.
        progress_bar=sys.stdout.isatty() and backend.num_workers == 1,
        metrics_log=self.metrics_log, mixed_targets=cfg.mixes_batches)
    self.actions = [self.logger, parts.guard]
    self.profiler = None
    if cfg.profile_steps:
      plan = parts.plan
      self.profiler = _Profiler(
          *cfg.profile_steps, logdir=os.path.join(cfg.model_dir,
                                                run_directory.PROFILE_DIR),
          global_step=parts.optimizer.iterations,
          # orbit's next loop: steps_per_loop, or fewer to the call's stop.
          next_loop_end=lambda step: min(step + plan.steps_per_loop,
                                         plan.next_stop(step)))
      self.actions.append(self.profiler)
    self.summaries = self.eval_summary_dir = None
    if cfg.enable_tensorboard and backend.is_chief:
      summary_dir = os.path.join(cfg.model_dir,
                                 run_directory.TRAIN_SUMMARIES_DIR)
      self.summaries = trainer_lib.ScalarSummaries(
          summary_dir, tf.summary.scalar,
          global_step=parts.optimizer.iterations)
      self.eval_summary_dir = os.path.join(cfg.model_dir,
                                           run_directory.EVAL_SUMMARIES_DIR)
      metrics.write_hparams(summary_dir, _hparams(cfg, plan))

  def close(self) -> None:
    if self.profiler:
      self.profiler.finish()
    self.logger.close()
    if self.metrics_log:
      if self._plots:
        _write_plots(self._model_dir)
      self.metrics_log.close()


def _controller(parts: assembly.Parts,
                reporting: _Reporting) -> orbit.Controller:
  """orbit's Controller of the run: its loops, actions and summaries (it
  neither restores nor saves: start.restore and run.py do)."""
  return orbit.Controller(
      strategy=parts.trainer.strategy, trainer=parts.trainer,
      evaluator=parts.evaluator, global_step=parts.optimizer.iterations,
      steps_per_loop=parts.plan.steps_per_loop,
      summary_manager=reporting.summaries,
      eval_summary_dir=reporting.eval_summary_dir,
      train_actions=reporting.actions)


@dataclasses.dataclass
class _Outcome:
  """Where the loop ended and what the last evaluation found."""
  step: int
  eval_results: Dict
  target_reached: bool = False
  seconds_to_target: Optional[float] = None


def _train_and_evaluate(cfg: RunConfig, parts: assembly.Parts,
                        controller: orbit.Controller, reporting: _Reporting,
                        start: start_lib.Start, started: float) -> _Outcome:
  """Loops to the end of the plan (or the target accuracy): checkpoints and
  evaluations at their steps, a checkpoint before a signal stops the run,
  and a last evaluation if none ran at the end."""
  plan, optimizer, manager = parts.plan, parts.optimizer, parts.manager
  saves = manager is not None
  outcome = _Outcome(step=start.step, eval_results={})
  while outcome.step < plan.total_train_steps and not outcome.target_reached:
    if cfg.progressive_resize_start_size:
      _resize_training_input(cfg, parts, outcome.step,
                             start.batches_read_at(outcome.step),
                             announce=outcome.step == start.step)
    try:
      controller.train(plan.next_stop(outcome.step),
                       checkpoint_at_completion=False)
    except guards.SignalReceived as stop:
      step = int(optimizer.iterations.numpy())
      if saves:
        path = manager.save(checkpoint_number=step)
        logging.info('saved checkpoint at step %d after signal (%s)', step,
                     path)
      raise RunStopped(f'stopped by {stop} at step {step}; rerun the same '
                       'command to resume', stop.exit_code) from None
    step = outcome.step = int(optimizer.iterations.numpy())
    if (cfg.enable_checkpoint_and_export and saves and
        plan.is_checkpoint_step(step)):
      logging.info('saved checkpoint %s', manager.save(checkpoint_number=step))
    if not cfg.skip_eval and plan.is_eval_step(step):
      outcome.eval_results = _evaluate(controller, plan, step,
                                       reporting.metrics_log)
      if _reached(cfg, outcome.eval_results):
        outcome.target_reached = True
        outcome.seconds_to_target = time.time() - started
        logging.info('target accuracy %.4f reached at epoch %.2f (%.4f) '
                     'after %.1f s; stopping', cfg.target_accuracy,
                     plan.epoch_of(step), outcome.eval_results['eval_accuracy'],
                     outcome.seconds_to_target)
  if not cfg.skip_eval and not outcome.eval_results:
    outcome.eval_results = _evaluate(controller, plan, outcome.step,
                                     reporting.metrics_log)
  return outcome


def _resize_training_input(cfg: RunConfig, parts: assembly.Parts, step: int,
                           data_start: int, announce: bool) -> None:
  """Progressive resizing: gives the trainer the input at the size of the
  epoch `step` is in, if that is a new size (stops fall on epoch ends), and
  says so (or, with `announce`, the size it starts at). The input goes on
  from the batch after `data_start` batches of the run's data, as one
  input of changing size would (exact resume); each size traces the
  training loop once."""
  epoch = step // parts.plan.steps_per_epoch
  size = schedules.image_size_for_run(cfg, epoch)
  if size != parts.train_image_size:
    parts.trainer.train_dataset = parts.train_input(size, data_start)
    parts.train_image_size = size
  elif not announce:
    return
  logging.info('progressive resizing: training at %d px from epoch %d (step '
               '%d)', size, epoch, step)


def _data_error(cfg: RunConfig, info: datasets.DatasetInfo,
                error: tf.errors.OpError) -> Optional[UsageError]:
  """The one-line error for a data error, if it has a known cause."""
  if 'label out of range' in error.message:
    return UsageError(f'a record in --data_dir={cfg.data_dir} has a label '
                      f'outside 1..{info.num_classes}; fix the records or '
                      'their metadata.json, or raise --num_classes')
  logging.info('data error (%s); looking for the corrupt file',
               error.message.strip().splitlines()[0][:200])
  message = datasets.corrupt_data_message(cfg, info)
  return UsageError(message) if message else None


def _export(basis: assembly.Basis, parts: assembly.Parts) -> None:
  """--enable_checkpoint_and_export: the chief exports the trained model."""
  cfg, backend = basis.cfg, basis.backend
  if not cfg.enable_checkpoint_and_export:
    return
  with ema_lib.in_model(parts.ema):
    if backend.is_chief:
      path, = saved_model.export_run(parts.network, cfg, cfg.model_dir)
      logging.info('exported SavedModel to %s%s', path,
                   ' (the weight average)' if parts.ema else '')
    elif backend.collective_saves:
      # Under multi_worker_mirrored reading the weights is a collective
      # (batch norm statistics are averaged when read): the other workers
      # join the chief's read, once, as its export copies them.
      parts.network.get_weights()


def _summary(basis: assembly.Basis, parts: assembly.Parts,
             logger: metrics.StepLogger, outcome: _Outcome,
             start: start_lib.Start,
             started: float) -> Dict:
  """run_summary.json: what the run did, how fast, and what it reached."""
  cfg, backend, info, plan = basis.cfg, basis.backend, basis.info, parts.plan
  eval_results, step = outcome.eval_results, outcome.step
  return {
      'global_batch_size': plan.global_batch_size,
      'num_replicas': plan.num_replicas,
      'num_workers': backend.num_workers,
      'worker_index': backend.worker_index,
      'distribution': backend.name,
      'train_steps': step,
      'steps_per_epoch': plan.steps_per_epoch,
      'epochs_completed': step / plan.steps_per_epoch,
      'resumed_from_step': start.step,
      'train_loss': logger.last_loss,
      'train_accuracy': logger.last_accuracy,
      # Mixup/CutMix: the training loss and accuracy are on mixed targets.
      'train_targets': 'mixed' if cfg.mixes_batches else 'labels',
      'eval_loss': eval_results.get('eval_loss'),
      'eval_accuracy': eval_results.get('eval_accuracy'),
      'eval_top5_accuracy': eval_results.get('eval_top5_accuracy'),
      'eval_examples': eval_results.get('eval_examples', 0),
      'avg_exp_per_second': logger.average_examples_per_second,
      'input_wait_fraction': logger.input_wait_fraction,
      'skipped_corrupt_records': parts.skipped.count if parts.skipped else 0,
      # Where the training input came from; its wait: input_wait_fraction.
      'tf_data_service': ({
          'address': cfg.tf_data_service,
          'sharding': cfg.tf_data_service_sharding,
          'data_workers': cfg.tf_data_service_workers or None,
      } if cfg.tf_data_service else None),
      'dtype': cfg.dtype,
      'optimizer': cfg.optimizer,
      'lr_schedule': cfg.lr_schedule,
      'model': cfg.model_name,
      'num_classes': info.num_classes,
      'dataset': info.name,
      'target_accuracy_reached': outcome.target_reached,
      # From the start of this process, data and model setup included.
      'seconds_to_target': outcome.seconds_to_target,
      'wall_seconds': time.time() - started,
      # ru_maxrss is in KiB on Linux.
      'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      'weights_sha256': weights_digest(parts.model),
      'runtime': basis.runtime_record,
      'host': launch.this_host(os.environ),
      'restarts': supervisor.restart_count(os.environ),
      # Every shape the job trained in (workers, batches, LR scale), each
      # from its step: an elastic job's shrinks and regrowths.
      'world_sizes': world.read(cfg.model_dir),
      'lr_scale': plan.lr_scale,
  }


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
    paths = curves.write_plots(model_dir)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('plots not written (%s); metrics.jsonl is complete: '
                    'python -m resnet_keras.plots %s', e, model_dir)
  else:
    logging.info('wrote %d plots to %s', len(paths),
                 os.path.join(model_dir, run_directory.PLOTS_DIR))


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
