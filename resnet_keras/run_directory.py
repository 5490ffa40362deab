"""The run directory's contract: every file and folder a run writes in its
model_dir, each named here once, and the one reading of its latest
checkpoint. The trainer, the tools (export, validate, average, plots) and
the launcher read and write through it, as the exports go through
serving/contract.py.

  config.json            the effective config, the training plan and the
                         machine: what the checkpoints are checkpoints of
                         (checkpoints.py; every tool rebuilds the run from it)
  world_sizes.json       the job's shape from each start (world.py)
  scheduler.json         each start of a Slurm job, and the signal that
                         stopped it (scheduler.py)
  warm_start.json        where a warm start began (start.py)
  metrics.jsonl          one record per log line and evaluation (metrics.py)
  run_summary.json       what the run did (reporting.py); other workers'
                         in worker_N/
  checkpoint, ckpt-N.*   TensorFlow's state file and the checkpoints,
                         named by step (checkpoints.py)
  saved_model/           the run's export at its end
  plots/                 PNGs of metrics.jsonl (curves.py; the tool:
                         plots.py)
  train/, eval/          TensorBoard summaries (--enable_tensorboard)
  profile/               --profile_steps' TensorBoard profile
  wandb/                 --wandb's local files and run_id (tracking.py)
  worker_N/              what worker N > 0 writes (its run_summary.json,
                         checkpoints/: its scratch share of collective saves)
  exports/<ckpt-N>/      the export tool's files (serving/contract.py)
  validation.csv, validation_exports.csv   the validate tool's scores
  averaged/              the average tool's run directory, with
                         averaging.json

This module never imports TensorFlow: the launcher reads model_dir through
it before TensorFlow loads.
"""

import codecs
import dataclasses
import os
import re
from typing import Optional

CONFIG_FILE = 'config.json'
WORLD_FILE = 'world_sizes.json'
SCHEDULER_FILE = 'scheduler.json'
WARM_START_FILE = 'warm_start.json'
METRICS_FILE = 'metrics.jsonl'
SUMMARY_FILE = 'run_summary.json'
# TensorFlow's CheckpointManager names each checkpoint PREFIX-<step> and
# lists them in its state file.
CHECKPOINT_PREFIX = 'ckpt'
CHECKPOINT_STATE_FILE = 'checkpoint'
SAVED_MODEL_DIR = 'saved_model'
PLOTS_DIR = 'plots'
TRAIN_SUMMARIES_DIR = 'train'
EVAL_SUMMARIES_DIR = 'eval'
PROFILE_DIR = 'profile'
WANDB_DIR = 'wandb'
WANDB_RUN_ID_FILE = 'run_id'  # in WANDB_DIR: the W&B run a rerun resumes
WORKER_CHECKPOINTS_DIR = 'checkpoints'
EXPORTS_DIR = 'exports'
VALIDATION_FILE = 'validation.csv'
VALIDATION_EXPORTS_FILE = 'validation_exports.csv'
AVERAGED_DIR = 'averaged'
AVERAGING_FILE = 'averaging.json'

# The state file is a text-format CheckpointState; its latest checkpoint is
# one C-escaped string field.
_LATEST = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"',
                     re.MULTILINE)


def worker_dir(model_dir: str, worker_index: int) -> str:
  """Where worker `worker_index` writes: model_dir for the chief (0), a
  folder of its own for the others, so no worker overwrites the chief's
  files."""
  if worker_index == 0:
    return model_dir
  return os.path.join(model_dir, f'worker_{worker_index}')


@dataclasses.dataclass(frozen=True)
class LatestCheckpoint:
  """model_dir's latest checkpoint, as its state file names it."""
  prefix: str  # DIR/ckpt-<step>: what tf.train.Checkpoint.restore takes
  step: int  # from its name: the step the run saved it at
  written: float  # when the state file was last written (seconds)


def latest_checkpoint(model_dir: str) -> Optional[LatestCheckpoint]:
  """model_dir's latest checkpoint, or None where tf.train.latest_checkpoint
  finds none: no state file, one without a latest path, or one naming files
  that are gone. A relative path in the state file is relative to
  model_dir, as TensorFlow writes and reads it."""
  path = os.path.join(model_dir, CHECKPOINT_STATE_FILE)
  try:
    with open(path) as f:
      found = _LATEST.search(f.read())
    written = os.path.getmtime(path)
  except (OSError, UnicodeDecodeError):
    return None
  if not found:
    return None
  prefix = codecs.escape_decode(found.group(1).encode())[0].decode()
  prefix = os.path.join(model_dir, prefix)  # an absolute prefix stays
  step = re.fullmatch(r'.*-(\d+)', os.path.basename(prefix))
  if not step or not (os.path.exists(prefix + '.index') or
                      os.path.exists(prefix)):
    return None
  return LatestCheckpoint(prefix, int(step.group(1)), written)
