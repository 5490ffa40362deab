"""One training run: set up -> decide the start -> assemble -> restore ->
loop -> finish.

This module owns *when* things happen: train loops of `steps_per_loop` steps,
evaluation every `epochs_between_evals` epochs (from `eval_offset_epochs`)
and at the end, checkpoints, the target-accuracy stop and the export. Where
a run starts is start.py's decision; what its parts are, assembly.py's; what
a step computes, objective.py's and trainer.py's; evaluation,
evaluator.py's; what the run reports (log lines, metrics.jsonl, plots,
run_summary.json), reporting.py's; what its files are called,
run_directory.py's.

One config lives in a run: the effective config (assembly.Basis's, classes
resolved), which config.json records; only the TensorBoard hparams record
the config as asked, as they always have (reporting.py).
"""

import dataclasses
import gc
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import orbit
import tensorflow as tf
from absl import logging

from common import distribution
from common import worker_contract
from resnet_keras import assembly
from resnet_keras import ema as ema_lib
from resnet_keras import goodput
from resnet_keras import guards
from resnet_keras import job_starts
from resnet_keras import lr_schedules
from resnet_keras import ownership
from resnet_keras import reporting
from resnet_keras import run_directory
from resnet_keras import start as start_lib
from resnet_keras import tracking
from resnet_keras import watchdog
from resnet_keras import world
from resnet_keras.config import RunConfig
from resnet_keras.plan import TrainingPlan
from resnet_keras.data import input_service
from resnet_keras.data import datasets
from resnet_keras.serving import saved_model
from common.errors import RunStopped, UsageError

# orbit's Controller logs every status twice (log and stdout) as multi-line
# dicts; StepLogger and Reporting.evaluated print one line each instead.
orbit.controller._log = logging.debug  # pylint: disable=protected-access


def with_model_dir(cfg: RunConfig, environ) -> RunConfig:
  """`cfg` with a model_dir: the one given, or (none) a new private
  directory of this run's, so that no two users or runs share a default.
  A job of several workers (MPI's or TF_CONFIG's) must name one, on
  storage every host shares."""
  if cfg.model_dir:
    return cfg
  if worker_contract.several_workers(environ):
    raise UsageError('a job of several workers needs --model_dir: name a '
                     'directory on storage every host shares')
  model_dir = tempfile.mkdtemp(prefix='resnet_keras_run_')
  logging.info('no --model_dir given: this run writes to %s, a new private '
               'directory (give --model_dir to choose one, and to resume)',
               model_dir)
  return dataclasses.replace(cfg, model_dir=model_dir)


def run(cfg: RunConfig, started: Optional[float] = None) -> Dict:
  """Trains (and evaluates) as `cfg` says; returns the run summary.
  `started`: when this process began its work (time.time(); the entry
  point's main, before TensorFlow loads), where the run's start-up and
  wall time begin; by default, now."""
  try:
    return _run(with_model_dir(cfg, os.environ), started or time.time())
  finally:
    # The run's objects hold its input iterators (and tf.data service
    # clients) in reference cycles that only a garbage collection frees.
    # Freed now they go in 0.2 s; freed by a collection 90 s later, the
    # training iterator's destructor waited 50 s for tf.data's autotuning
    # thread (it did not wake to its cancellation), inside whatever code
    # that collection interrupted. A service client would meanwhile keep
    # calling a dispatcher that may be gone.
    gc.collect()


def _run(cfg: RunConfig, started: float) -> Dict:
  """Set up -> decide the start -> assemble -> restore -> loop -> finish.
  The summary's wall_seconds and seconds_to_target count from here, as
  they always have (time-to-accuracy figures compare them); goodput counts
  from the process's `started`."""
  run_started = time.time()
  cfg.check()
  worker = worker_contract.worker_index(os.environ)
  # The chief holds model_dir before anything is read or written there
  # (ownership.py); the other workers write only their own worker_N/.
  owner = (ownership.for_training(cfg.model_dir, cfg.clean, os.environ)
           if worker == 0 else None)
  try:
    return _run_held(cfg, started, run_started, worker)
  finally:
    if owner:
      owner.release()


def _run_held(cfg: RunConfig, started: float, run_started: float,
              worker: int) -> Dict:
  # Watched from before the backend is built: the workers' joining waits
  # for every one of them (a worker frozen while it started, as on a
  # restart, held the others there for good).
  timeout = _stuck_worker_timeout(cfg)
  progress = distribution.Progress(
      joining_watch=lambda: watchdog.watched_from_outside(
          timeout, watchdog.stuck_line(
              worker, timeout, 'the joining deadline, 10 x --failure_timeout')),
      stall=goodput.stalled_seconds)
  deadlines = watchdog.Deadlines(
      progress, timeout,
      step_floor=cfg.tf_data_service_timeout if cfg.tf_data_service else 0)
  last_words = []  # The chief's goodput account, once it has one.
  stuck = watchdog.Watchdog(
      timeout, progress.waiting_since,
      watchdog.end_stuck_worker(worker, deadlines, last_words),
      deadline=deadlines.now).start()
  try:
    return _run_on(_set_up(cfg, progress), started, run_started, last_words)
  finally:
    stuck.stop()


def _stuck_worker_timeout(cfg: RunConfig) -> float:
  """Seconds a worker waits on the others' collectives before it ends
  itself (0: it waits; one worker, or no launcher set one)."""
  if not worker_contract.several_workers(os.environ):
    return 0
  return worker_contract.stuck_worker_timeout(
      os.environ, use_horovod=cfg.use_horovod) or 0


def _run_on(basis: assembly.Basis, started: float, run_started: float,
            last_words: List[Callable[[], None]]) -> Dict:
  """`last_words`: what a worker ending itself (stuck) does first."""
  cfg, backend = basis.effective_cfg, basis.backend
  plan = assembly.plan_for(basis)
  start = start_lib.decide(cfg, plan)
  if backend.is_chief:
    start_lib.check_announced(start, worker_contract.resume_step(os.environ),
                              cfg.model_dir)
  reporting.log_plan(basis, plan)
  parts = assembly.assemble_training(basis, plan, start)
  start_lib.restore(start, parts.weights(), cfg, basis.info, backend)
  attempt = goodput.Attempt(
      cfg.model_dir if backend.is_chief else None, started, start.step,
      stalled=lambda: backend.progress.stalled('training'))
  # A worker ended stuck lets the write in flight end first (the restart
  # resumes from its checkpoint), and a chief writes its account: the stall
  # that ended it is the job's stall, not a wait after its last record.
  last_words.extend((lambda: parts.saver.wait(attempt), attempt.write))
  with parts.guard.installed(), parts.saver.waited_at_end(attempt):
    outcome, reports = _train(basis, parts, start, run_started, attempt)
    _export(basis, parts, attempt, outcome.step)
  # The job's account is the chief's: only it records every attempt.
  job = attempt.job() if backend.is_chief else None
  summary = reporting.write_summary(basis, parts, reports, outcome,
                                    start.step, run_started, job)
  backend.leave()
  if job:
    logging.info('%s', goodput.sentence(job))
  return summary


def _set_up(cfg: RunConfig,
            progress: distribution.Progress) -> assembly.Basis:
  """The run's runtime, backend (watched by `progress`) and data."""
  if cfg.wandb:
    tracking.import_wandb()  # Its absence is a usage error; say so first.
  basis = assembly.set_up(cfg, progress=progress)
  backend = basis.backend
  if not backend.is_chief:
    logging.info('worker %d: logging warnings only; the chief (worker 0) '
                 'logs the run', backend.worker_index)
    logging.set_verbosity(logging.WARNING)
  return basis


def _train(basis: assembly.Basis, parts: assembly.Parts,
           start: start_lib.Start, started: float,
           attempt: goodput.Attempt
           ) -> Tuple[reporting.Outcome, reporting.Reporting]:
  """The loops, evaluations and checkpoints of the plan, from `start`
  (restored), with its guards and reports, timed in `attempt`; the outcome
  and the reports."""
  cfg, backend = basis.effective_cfg, basis.backend
  reports = reporting.Reporting(basis, parts)
  # No checkpoint manager: the controller neither restores nor saves. The
  # attempt's action comes first, to count the loop a guard stops the run
  # after.
  controller = orbit.Controller(
      strategy=parts.trainer.strategy, trainer=parts.trainer,
      evaluator=parts.evaluator, global_step=parts.optimizer.iterations,
      steps_per_loop=parts.plan.steps_per_loop,
      summary_manager=reports.summaries,
      eval_summary_dir=reports.eval_summary_dir,
      train_actions=[attempt] + reports.actions)
  if backend.is_chief:
    # metrics.jsonl first: one that does not read stops the run before
    # config.json says it is this run's.
    reports.resume_at(start.step)
    start_lib.write_run_files(
        start, cfg, parts.plan, basis.runtime_record,
        world.shape(backend.num_workers, parts.plan, os.environ))
    job_starts.record_start(cfg.model_dir, os.environ, start.step)
  input_watchdog = watchdog.Watchdog(
      cfg.tf_data_service_timeout if cfg.tf_data_service else 0,
      parts.step_record.input_waiting_since,
      input_service.end_stalled_run(cfg.tf_data_service)).start()
  if start.step < parts.plan.total_train_steps:
    logging.info('training to step %d; SIGTERM, SIGHUP or Ctrl-C: checkpoint '
                 'after the current step, then stop',
                 parts.plan.total_train_steps)
  else:  # start.decide refuses a checkpoint past the end.
    # The run had reached its end (an export or summary cut short): the
    # rest of its work, from that checkpoint.
    logging.info('--model_dir=%s is trained to step %d, the end of this '
                 'run: nothing to train; %s', cfg.model_dir, start.step,
                 _what_is_left(cfg))
  try:
    if reports.profiler:
      reports.profiler()  # the first loop may be the window's
    attempt.ready()
    outcome = _train_and_evaluate(cfg, backend, parts, controller, reports,
                                  start, started, attempt)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    error = _data_error(cfg, basis.info, e)
    if error is None:
      raise
    raise error from None
  finally:
    input_watchdog.stop()
    reports.close()
  return outcome, reports


def _what_is_left(cfg: RunConfig) -> str:
  done = [] if cfg.skip_eval else ['evaluating it']
  if cfg.enable_checkpoint_and_export:
    done.append('exporting it')
  return ', '.join(done + ['writing run_summary.json'])


def _train_and_evaluate(cfg: RunConfig, backend: distribution.Backend,
                        parts: assembly.Parts,
                        controller: orbit.Controller,
                        reports: reporting.Reporting, start: start_lib.Start,
                        started: float,
                        attempt: goodput.Attempt) -> reporting.Outcome:
  """Loops to the end of the plan (or the target accuracy): checkpoints and
  evaluations at their steps, a checkpoint before a signal stops the run,
  and a last evaluation if none ran at the end; each timed in `attempt`,
  which is written after each checkpoint and evaluation."""
  plan, optimizer, saver = parts.plan, parts.optimizer, parts.saver
  outcome = reporting.Outcome(step=start.step, eval_results={})
  while outcome.step < plan.total_train_steps and not outcome.target_reached:
    if cfg.progressive_resize_start_size:
      _resize_training_input(cfg, parts, outcome.step,
                             start.batches_read_at(outcome.step),
                             announce=outcome.step == start.step)
    try:
      with attempt.timing('training'), backend.progress.waiting('training'):
        controller.train(plan.next_stop(outcome.step),
                         checkpoint_at_completion=False)
    except guards.SignalReceived as stop:
      step = int(optimizer.iterations.numpy())
      if saver.saves:
        # Nothing goes on while this write runs: the process stops.
        saver.save(step, attempt, ' after signal')
        saver.wait(attempt)
      attempt.write()
      if backend.is_chief:
        job_starts.record_stop(cfg.model_dir, os.environ, str(stop), step)
      # No worker exits before the chief's checkpoint is written: a
      # scheduler (srun --kill-on-bad-exit, mpirun) ends the job's other
      # processes when one exits with an error.
      backend.wait_for_all()
      raise RunStopped(f'stopped by {stop} at step {step}; rerun the same '
                       f'command to resume{stop.hint}',
                       stop.exit_code) from None
    step = outcome.step = int(optimizer.iterations.numpy())
    if (cfg.enable_checkpoint_and_export and saver.saves and
        plan.is_checkpoint_step(step)):
      saver.save(step, attempt)
      attempt.write()
    if not cfg.skip_eval and plan.is_eval_step(step):
      outcome.eval_results = _evaluate(controller, reports, plan, step,
                                       attempt, backend)
      if _reached(cfg, outcome.eval_results):
        outcome.target_reached = True
        outcome.seconds_to_target = time.time() - started
        logging.info('target accuracy %.4f reached at epoch %.2f (%.4f) '
                     'after %.1f s; stopping', cfg.target_accuracy,
                     plan.epoch_of(step), outcome.eval_results['eval_accuracy'],
                     outcome.seconds_to_target)
  if not cfg.skip_eval and not outcome.eval_results:
    outcome.eval_results = _evaluate(controller, reports, plan, outcome.step,
                                     attempt, backend)
  return outcome


def _evaluate(controller: orbit.Controller, reports: reporting.Reporting,
              plan: TrainingPlan, step: int, attempt: goodput.Attempt,
              backend: distribution.Backend) -> Dict:
  # Each evaluation step tells the backend's progress it went on.
  with attempt.timing('evaluation'), backend.progress.waiting('evaluation'):
    results = controller.evaluate(steps=-1)
  reports.evaluated(plan, step, results)
  attempt.write()
  return results


def _resize_training_input(cfg: RunConfig, parts: assembly.Parts, step: int,
                           data_start: int, announce: bool) -> None:
  """Progressive resizing: gives the trainer the input at the size of the
  epoch `step` is in, if that is a new size (stops fall on epoch ends), and
  says so (or, with `announce`, the size it starts at). The input goes on
  from the batch after `data_start` batches of the run's data, as one
  input of changing size would (exact resume); each size traces the
  training loop once."""
  epoch = step // parts.plan.steps_per_epoch
  size = lr_schedules.image_size_for_run(cfg, epoch)
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


def _export(basis: assembly.Basis, parts: assembly.Parts,
            attempt: goodput.Attempt, step: int) -> None:
  """--enable_checkpoint_and_export: the chief exports the trained model
  (timed in `attempt`). A stop signal ends it at once (the guard's
  `at_once`: a scheduler's grace period may be shorter than an export),
  and says so; the run's checkpoint at `step` is written before the
  process ends (checkpoints.Saver.waited_at_end), and the rerun exports it
  (`_train`: nothing to train)."""
  cfg, backend = basis.effective_cfg, basis.backend
  if not cfg.enable_checkpoint_and_export:
    return
  try:
    with attempt.timing('export'), parts.guard.at_once(), \
        ema_lib.in_model(parts.ema):
      if backend.is_chief:
        logging.info('exporting the model of step %d', step)
        path, = saved_model.export_run(parts.network, cfg, cfg.model_dir)
        logging.info('exported SavedModel to %s%s', path,
                     ' (the weight average)' if parts.ema else '')
      elif backend.collective_saves:
        # Under multi_worker_mirrored reading the weights is a collective
        # (batch norm statistics are averaged when read): the other workers
        # join the chief's read, once, as its export copies them.
        with backend.progress.waiting('export'):
          parts.network.get_weights()
  except guards.StopNow as stop:
    attempt.write()
    if backend.is_chief:
      job_starts.record_stop(cfg.model_dir, os.environ, str(stop), step)
    raise RunStopped(
        f'stopped by {stop} during the export of step {step}\'s model: '
        f'{run_directory.SAVED_MODEL_DIR}/ and run_summary.json are not '
        'written (an earlier export stays as it was); rerun the same command '
        f'to write them from the newest checkpoint{stop.hint}',
        stop.exit_code) from None


def _reached(cfg: RunConfig, results: Dict) -> bool:
  return bool(cfg.target_accuracy and
              results['eval_accuracy'] >= cfg.target_accuracy)
