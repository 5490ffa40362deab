"""What a run reports: the plan's log lines, log lines and throughput as it
trains (metrics.StepLogger), evaluations' lines, metrics.jsonl and plots/
(the chief), TensorBoard summaries and hparams, --profile_steps' profile,
and at the end run_summary.json. run.py says when; this module says what.
"""

import dataclasses
import hashlib
import os
import resource
import sys
import time
from typing import Callable, Dict, Optional

import tensorflow as tf
from absl import logging

from resnet_keras import files
from common import worker_contract
from resnet_keras.engine import assembly
from resnet_keras.training import curves
from resnet_keras.training import job_starts
from resnet_keras.engine import metrics
from resnet_keras.optimization import optimizers
from resnet_keras.rundir import run_directory
from resnet_keras.training import slow_workers
from resnet_keras.training import tracking
from resnet_keras.engine import trainer as trainer_lib
from resnet_keras.engine import world
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan


def log_plan(basis: assembly.Basis, plan: TrainingPlan) -> None:
  """The lines that say what the run will do, before it builds anything."""
  cfg, info, backend = basis.effective_cfg, basis.info, basis.backend
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


def log_start(cfg: RunConfig, start_step: int, total_train_steps: int) -> None:
  """Where training goes from `start_step`: to the plan's end (and how a
  signal stops it), or, for a run that had reached it, nowhere, with what
  is left to do."""
  if start_step < total_train_steps:
    logging.info('training to step %d; SIGTERM, SIGHUP or Ctrl-C: checkpoint '
                 'after the current step, then stop', total_train_steps)
  else:  # start.decide refuses a checkpoint past the end.
    # The run had reached its end (an export or summary cut short): the
    # rest of its work, from that checkpoint.
    logging.info('--model_dir=%s is trained to step %d, the end of this '
                 'run: nothing to train; %s', cfg.model_dir, start_step,
                 _what_is_left(cfg))


def _what_is_left(cfg: RunConfig) -> str:
  done = [] if cfg.skip_eval else ['evaluating it']
  if cfg.enable_checkpoint_and_export:
    done.append('exporting it')
  return ', '.join(done + ['writing run_summary.json'])


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


class Reporting:
  """What a run reports as it trains: log lines and throughput (StepLogger),
  metrics.jsonl and plots (the chief), TensorBoard summaries and profile;
  `actions` are orbit's train actions among them."""

  def __init__(self, basis: assembly.Basis, parts: assembly.Parts):
    cfg, backend, plan = basis.effective_cfg, basis.backend, parts.plan
    self._model_dir = cfg.model_dir
    self._plots = cfg.plots
    self.metrics_log = None
    if backend.is_chief:
      self.metrics_log = metrics.MetricsLog(
          cfg.model_dir, mirror=(tracking.start_wandb(cfg, plan)
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
    self.slow_workers = slow_workers.SlowWorkers(log=backend.is_chief)
    self.actions = [self.logger, self.slow_workers, parts.guard]
    self.profiler = None
    if cfg.profile_steps:
      self.profiler = _Profiler(
          *cfg.profile_steps,
          logdir=os.path.join(cfg.model_dir, run_directory.PROFILE_DIR),
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
      # The config as asked (--num_classes 0: from the data), as the
      # hparams have always recorded it.
      metrics.write_hparams(summary_dir, _hparams(basis.cfg, plan))

  def resume_at(self, step: int) -> None:
    """metrics.jsonl goes on from `step` (the chief's). Its log line at
    `step`, if it has one, gives the training loss and accuracy until this
    attempt trains a step: a rerun of a run that had reached its end (its
    export or summary cut short) trains none, and reports what that run
    logged last, not NaN."""
    if self.metrics_log:
      kept = self.metrics_log.resume_at(step)
      logged = [r for r in kept if r['step'] == step and
                isinstance(r.get('train_loss'), (int, float)) and
                isinstance(r.get('train_accuracy'), (int, float))]
      if logged:
        self.logger.last_loss = float(logged[-1]['train_loss'])
        self.logger.last_accuracy = float(logged[-1]['train_accuracy'])

  def evaluated(self, plan: TrainingPlan, step: int, results: Dict) -> None:
    """The line and metrics.jsonl record of an evaluation at `step`."""
    if self.metrics_log is not None:
      self.metrics_log.append({'step': step, 'epoch': plan.epoch_of(step),
                               **results})
    logging.info(
        'eval at step %d (epoch %.2f): accuracy %.4f, top-5 %.4f, loss %.4f '
        'over %d examples', step, plan.epoch_of(step),
        results['eval_accuracy'], results['eval_top5_accuracy'],
        results['eval_loss'], results['eval_examples'])
    if results['eval_examples'] != plan.num_eval_examples:
      logging.warning('evaluated %d examples, expected %d',
                      results['eval_examples'], plan.num_eval_examples)

  def close(self) -> None:
    if self.profiler:
      self.profiler.finish()
    self.logger.close()
    if self.metrics_log:
      if self._plots:
        _write_plots(self._model_dir)
      self.metrics_log.close()


@dataclasses.dataclass
class Outcome:
  """Where the loop ended and what the last evaluation found."""
  step: int
  eval_results: Dict
  target_reached: bool = False
  seconds_to_target: Optional[float] = None


def write_summary(basis: assembly.Basis, parts: assembly.Parts,
                  reports: Reporting, outcome: Outcome,
                  resumed_from_step: int, started: float,
                  goodput: Optional[Dict]) -> Dict:
  """The end-of-run account of --skip_corrupt_records, then this worker's
  run_summary.json (its line in the log); returns the summary. `goodput`:
  the job's goodput block (goodput.split; the chief's, None elsewhere);
  `reports`, what the run reported as it trained."""
  cfg, backend = basis.effective_cfg, basis.backend
  if parts.skipped:
    _report_skipped(parts.skipped.count, outcome.eval_results,
                    basis.info.num_eval_examples)
  summary = _summary(basis, parts, reports.logger, outcome,
                     resumed_from_step, started)
  summary['goodput'] = goodput
  summary.update(reports.slow_workers.summary())
  write_dir = run_directory.worker_dir(cfg.model_dir, backend.worker_index)
  os.makedirs(write_dir, exist_ok=True)
  files.write_json_atomically(
      os.path.join(write_dir, run_directory.SUMMARY_FILE), summary)
  logging.info('run summary: %s', summary)
  return summary


def weights_digest(model) -> str:
  """sha256 of the trainable weights: equal on every worker of a job."""
  digest = hashlib.sha256()
  for variable in model.trainable_variables:
    digest.update(variable.numpy().tobytes())
  return digest.hexdigest()


def _summary(basis: assembly.Basis, parts: assembly.Parts,
             logger: metrics.StepLogger, outcome: Outcome,
             resumed_from_step: int, started: float) -> Dict:
  """run_summary.json: what the run did, how fast, and what it reached."""
  cfg, backend, info = basis.effective_cfg, basis.backend, basis.info
  plan, eval_results, step = parts.plan, outcome.eval_results, outcome.step
  return {
      'global_batch_size': plan.global_batch_size,
      'num_replicas': plan.num_replicas,
      'num_workers': backend.num_workers,
      'worker_index': backend.worker_index,
      'distribution': backend.name,
      'train_steps': step,
      'steps_per_epoch': plan.steps_per_epoch,
      'epochs_completed': step / plan.steps_per_epoch,
      'resumed_from_step': resumed_from_step,
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
      'host': worker_contract.this_host(os.environ),
      'restarts': worker_contract.restart_count(os.environ),
      # Slurm's job, its nodes and each start it requeued (None elsewhere).
      'scheduler': job_starts.summary(cfg.model_dir, os.environ),
      # Every shape the job trained in (workers, batches, LR scale), each
      # from its step: an elastic job's shrinks and regrowths.
      'world_sizes': world.read(cfg.model_dir),
      'lr_scale': plan.lr_scale,
  }


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


def _hparams(cfg: RunConfig, plan: TrainingPlan) -> Dict:
  hparams = {k: v for k, v in vars(cfg).items() if v is not None}
  hparams['global_batch_size'] = plan.global_batch_size
  return hparams
