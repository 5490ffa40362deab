"""The job's shape over a run: workers, each worker's batch, micro-batches,
the global batch and the learning rate's scale, each from the step it
started at.

An elastic job (demo_resnet_keras.py --min_hosts) restarts on fewer hosts,
and on more when lost ones come back; a user may rerun by hand on another
count. The chief records the shape each attempt starts with in
model_dir/world_sizes.json, so that a resumed run knows how many examples
its input gave before (the data goes on after them, whatever the batch is
now: start.py) and run_summary.json lists every change with its step.
"""

import os
from typing import Dict, List, Mapping, Optional

from common import batch_rule
from resnet_keras import files
from common import worker_contract
from common.errors import UsageError
from resnet_keras.files import write_json_atomically
from resnet_keras.rundir import run_directory
from resnet_keras.config.plan import TrainingPlan


def shape(num_workers: int, plan: TrainingPlan,
          environ: Mapping[str, str]) -> Dict:
  """The shape of a job of `num_workers` that trains `plan` (without the
  step it starts at), on the hosts of `environ`'s MULTI_HLS_IPS."""
  return {'workers': num_workers,
          'hosts': worker_contract.hosts(environ),
          'global_batch_size': plan.global_batch_size,
          'worker_batch_size': batch_rule.worker_batch(plan.global_batch_size,
                                                       num_workers),
          'micro_batches': plan.num_micro_batches,
          'lr_scale': plan.lr_scale}


def read(model_dir: str) -> List[Dict]:
  """The recorded shapes, oldest first (none: a run from before this file,
  or one that has not started).

  A damaged file is refused in one line, not passed over: a resume reads
  from it where its data goes on, and without it would silently take the
  job's batch as the one it always had. Deleting the file says so."""
  path = os.path.join(model_dir, run_directory.WORLD_FILE)
  history, why = files.read_records(
      path, lambda entry: isinstance(entry, dict) and _count(
          entry.get('step')) and _count(entry.get('global_batch_size')))
  if why:
    raise UsageError(
        f'{path} is damaged ({why}; each a shape with an integer "step" and '
        '"global_batch_size"): it records the job\'s batch sizes, from which '
        'a resume finds where its data goes on; restore it, or delete it to '
        'resume as a job whose batch never changed')
  return history


def _count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def record(model_dir: str, shape: Dict) -> List[Dict]:
  """Appends `shape` (with its 'step') unless it is the shape already in
  force; shapes at or after its step are dropped first (an attempt that
  resumes from an earlier checkpoint redoes those steps). Returns the
  history written."""
  history = [entry for entry in read(model_dir)
             if entry['step'] < shape['step']]
  if not history or _without_step(history[-1]) != _without_step(shape):
    history.append(shape)
  write_json_atomically(os.path.join(model_dir, run_directory.WORLD_FILE),
                        history)
  return history


def _without_step(shape: Dict) -> Dict:
  return {k: v for k, v in shape.items() if k not in ('step', 'hosts')}


def examples_read(history: List[Dict], step: int) -> Optional[int]:
  """Training examples the run's input gave from its first recorded shape
  up to `step`: each shape's global batch times the steps it trained
  (None without a history)."""
  if not history:
    return None
  total = 0
  for entry, following in zip(history, history[1:] + [None]):
    end = min(step, following['step'] if following else step)
    total += max(0, end - entry['step']) * entry['global_batch_size']
  return total
