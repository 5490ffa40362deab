"""The export at a run's end (--enable_checkpoint_and_export): the chief
writes model_dir/saved_model (serving/saved_model.py), the other workers
take part where reading the weights is a collective, and a stop signal
ends it at once, saying what is left for the rerun."""

import os

from absl import logging

from common.errors import RunStopped
from resnet_keras.engine import assembly
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.training import goodput
from resnet_keras.engine import guards
from resnet_keras.training import job_starts
from resnet_keras.rundir import checkpoints
from resnet_keras.rundir import run_directory
from resnet_keras.serving import saved_model


def export(basis: assembly.Basis, parts: assembly.Parts,
           attempt: goodput.Attempt, step: int) -> None:
  """--enable_checkpoint_and_export: the chief exports the trained model
  (timed in `attempt`). A stop signal ends it at once (the guard's
  `at_once`: a scheduler's grace period may be shorter than an export),
  and says so; the run's checkpoint at `step` is written before the
  process ends (checkpoints.Saver.waited_at_end), and the rerun exports it
  (run.py: nothing to train)."""
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
        # join the chief's read, once, as its export copies them
        # (saved_model.portable_copy).
        with backend.progress.waiting('export'):
          checkpoints.values(parts.network.weights)
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
