"""A scheduled run's account: under Slurm the chief records, in
model_dir/scheduler.json, each start of the job (its job id, the nodes,
how many times Slurm had requeued it, the step it starts at) and the
signal that stopped an attempt and the step it saved at, so that
run_summary.json names the scheduler, the job, its nodes and every
requeue. Outside a Slurm job nothing is written.
"""

import os
import time
from typing import Dict, List, Mapping, Optional

from absl import logging

from resnet_keras import files
from common import worker_contract as contract
from resnet_keras.files import write_json_atomically
from resnet_keras.rundir import run_directory


def read(model_dir: str) -> List[Dict]:
  """The recorded starts, oldest first. A damaged file is passed over with
  one warning, keeping the starts that read: it is only an account, which
  no step depends on (as goodput.json)."""
  path = os.path.join(model_dir, run_directory.SCHEDULER_FILE)
  starts, why = files.read_records(
      path, lambda s: isinstance(s, dict) and isinstance(s.get('job_id'), str))
  if why:
    logging.warning('%s is damaged (%s): it goes on with the %d starts that '
                    'read', path, why, len(starts))
  return starts


def _write(model_dir: str, starts: List[Dict]) -> None:
  write_json_atomically(os.path.join(model_dir, run_directory.SCHEDULER_FILE),
                        starts)


def record_start(model_dir: str, environ: Mapping[str, str],
                 step: int) -> None:
  """Appends this start of a Slurm job (nothing outside one)."""
  if not contract.in_slurm_allocation(environ):
    return
  _write(model_dir, read(model_dir) + [{
      'scheduler': 'slurm',
      'job_id': contract.slurm_job_id(environ),
      'requeues': contract.requeues(environ),
      'restarts': contract.restart_count(environ),
      'nodes': contract.slurm_step_nodes(environ),
      'step': step,
      'started': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
  }])


def record_stop(model_dir: str, environ: Mapping[str, str], signal_name: str,
                step: int) -> None:
  """Adds to this start's record the signal that stopped it and the step
  it saved at."""
  starts = read(model_dir)
  if not contract.in_slurm_allocation(environ) or not starts:
    return
  starts[-1].update(stopped_by=signal_name, saved_at_step=step)
  _write(model_dir, starts)


def summary(model_dir: str, environ: Mapping[str, str]) -> Optional[Dict]:
  """run_summary.json's 'scheduler': this job and its nodes, and each start
  Slurm requeued it for (with where the start before it stopped)."""
  if not contract.in_slurm_allocation(environ):
    return None
  starts = [s for s in read(model_dir)
            if s['job_id'] == contract.slurm_job_id(environ)]
  return {'name': 'slurm',
          'job_id': contract.slurm_job_id(environ),
          'nodes': contract.slurm_step_nodes(environ),
          'requeues': contract.requeues(environ),
          'starts': starts}
