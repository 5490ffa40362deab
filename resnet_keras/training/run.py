"""One training run: set up -> decide the start -> assemble -> restore ->
loop -> finish.

This module owns *when* things happen: train loops of `steps_per_loop` steps,
evaluation every `epochs_between_evals` epochs (from `eval_offset_epochs`)
and at the end, checkpoints, the target-accuracy stop and the export. Where
a run starts is start.py's decision; what its parts are, assembly.py's; what
a step computes, objective.py's and trainer.py's; evaluation,
evaluator.py's; what the run reports (log lines, metrics.jsonl, plots,
run_summary.json), reporting.py's; what its files are called,
run_directory.py's. How each cross-cutting piece works has its own room:
the stuck-worker watchdog (stuck_workers.py), a data error's one line
(data/datasets.py), progressive resizing (progressive_resizing.py), the
export at the end (final_export.py).

One config lives in a run: the effective config (assembly.Basis's, classes
resolved), which config.json records; only the TensorBoard hparams record
the config as asked, as they always have (reporting.py).
"""

import gc
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import orbit
from absl import logging

from resnet_keras.engine import distribution
from common import worker_contract
from resnet_keras.engine import assembly
from resnet_keras.training import final_export
from resnet_keras.training import goodput
from resnet_keras.engine import guards
from resnet_keras.training import job_starts
from resnet_keras.rundir import ownership
from resnet_keras.training import reporting
from resnet_keras.rundir import run_directory
from resnet_keras.engine import start as start_lib
from resnet_keras.training import stuck_workers
from resnet_keras.training import timed_saves
from resnet_keras.training import tracking
from resnet_keras.training import watchdog
from resnet_keras.engine import world
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan
from resnet_keras.data import input_service
from resnet_keras.data import datasets
from common.errors import RunStopped

# orbit's Controller logs every status twice (log and stdout) as multi-line
# dicts; StepLogger and Reporting.evaluated print one line each instead.
orbit.controller._log = logging.debug  # pylint: disable=protected-access


def run(cfg: RunConfig, started: Optional[float] = None) -> Dict:
  """Trains (and evaluates) as `cfg` says; returns the run summary.
  `started`: when this process began its work (time.time(); the entry
  point's main, before TensorFlow loads), where the run's start-up and
  wall time begin; by default, now."""
  try:
    return _run(run_directory.with_model_dir(cfg, os.environ),
                started or time.time())
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
    with stuck_workers.watched(cfg, worker) as (progress, last_words):
      return _run_on(_set_up(cfg, progress), started, run_started,
                     last_words)
  finally:
    if owner:
      owner.release()


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
    final_export.export(basis, parts, attempt, outcome.step)
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


def _timed_saves(cfg: RunConfig, backend: distribution.Backend,
                 parts: assembly.Parts, attempt: goodput.Attempt
                 ) -> List[timed_saves.TimedSaves]:
  """Checkpoints by time, where the run checkpoints (timed_saves.py)."""
  if not (cfg.enable_checkpoint_and_export and parts.saver.saves):
    return []
  agree = ((lambda due: backend.any_worker(due)[0])
           if backend.collective_saves else None)
  return [timed_saves.for_run(
      cfg.checkpoint_interval_seconds, cfg.model_dir, backend.is_chief,
      parts.saver, lambda: int(parts.optimizer.iterations.numpy()),
      attempt, agree)]


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
      train_actions=[attempt] + reports.actions + _timed_saves(
          cfg, backend, parts, attempt))
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
  reporting.log_start(cfg, start.step, parts.plan.total_train_steps)
  try:
    with datasets.errors_named(cfg, basis.info):
      if reports.profiler:
        reports.profiler()  # the first loop may be the window's
      attempt.ready()
      outcome = _train_and_evaluate(cfg, backend, parts, controller, reports,
                                    start, started, attempt)
  finally:
    input_watchdog.stop()
    reports.close()
  return outcome, reports


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
      parts.training_input.follow(parts.trainer, outcome.step,
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


def _reached(cfg: RunConfig, results: Dict) -> bool:
  return bool(cfg.target_accuracy and
              results['eval_accuracy'] >= cfg.target_accuracy)
