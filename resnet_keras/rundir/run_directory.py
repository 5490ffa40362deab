"""The run directory's contract: every file and folder a run writes in its
model_dir, each named here once; the one reading of its latest checkpoint;
and the model_dir of a run given none (`with_model_dir`). The trainer, the
tools (export, validate, average, plots) and the launcher read and write
through it, as the exports go through serving/contract.py.

  config.json            the effective config, the training plan and the
                         machine: what the checkpoints are checkpoints of
                         (checkpoints.py; every tool rebuilds the run from it)
  world_sizes.json       the job's shape from each start (world.py)
  scheduler.json         each start of a Slurm job, and the signal that
                         stopped it (job_starts.py)
  warm_start.json        where a warm start began (start.py)
  goodput.json           each attempt's timings, the job's goodput
                         (goodput.py)
  metrics.jsonl          one record per log line and evaluation (metrics.py)
  run_summary.json       what the run did (reporting.py); other workers'
                         in worker_N/
  checkpoint, ckpt-N.*   TensorFlow's state file and the checkpoints,
                         named by step (checkpoints.py)
  run.lock               who writes the directory now (run_lock.py)
  run_files.txt          every path a run wrote here (ownership.py)
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

Which of these a directory holds is the run's only where its record
(run_files.txt) says a run wrote it: ownership.py holds the directory, and
--clean removes what the record names and nothing else. The names here
tell a run's entries only in a directory an earlier version wrote, which
had no record.

This module never imports TensorFlow: the launcher reads model_dir through
it before TensorFlow loads.
"""

import codecs
import dataclasses
import os
import re
import tempfile
from typing import List, Mapping, Optional

from absl import logging

from common import worker_contract
from common.errors import UsageError
from resnet_keras.config import RunConfig

CONFIG_FILE = 'config.json'
WORLD_FILE = 'world_sizes.json'
SCHEDULER_FILE = 'scheduler.json'
WARM_START_FILE = 'warm_start.json'
GOODPUT_FILE = 'goodput.json'
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
LOCK_FILE = 'run.lock'
RECORD_FILE = 'run_files.txt'

# The state file is a text-format CheckpointState; its latest checkpoint and
# those it keeps are C-escaped string fields.
_LATEST, _KEPT = (
    re.compile(rf'^{field}:\s*"((?:[^"\\]|\\.)*)"', re.MULTILINE)
    for field in ('model_checkpoint_path', 'all_model_checkpoint_paths'))


def worker_dir(model_dir: str, worker_index: int) -> str:
  """Where worker `worker_index` writes: model_dir for the chief (0), a
  folder of its own for the others, so no worker overwrites the chief's
  files."""
  if worker_index == 0:
    return model_dir
  return os.path.join(model_dir, f'worker_{worker_index}')


def with_model_dir(cfg: RunConfig, environ: Mapping[str, str]) -> RunConfig:
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


@dataclasses.dataclass(frozen=True)
class LatestCheckpoint:
  """model_dir's latest checkpoint, as its state file names it."""
  prefix: str  # DIR/ckpt-<step>: what tf.train.Checkpoint.restore takes
  step: int  # from its name: the step the run saved it at
  written: float  # when the state file was last written (seconds)


def _state(model_dir: str):
  """The state file's text and when it was written; (None, 0) unreadable."""
  path = os.path.join(model_dir, CHECKPOINT_STATE_FILE)
  try:
    with open(path) as f:
      return f.read(), os.path.getmtime(path)
  except (OSError, UnicodeDecodeError):
    return None, 0


def _named_prefix(model_dir: str, escaped: str) -> str:
  """The path a state file's field names. A relative path is relative to
  model_dir, as TensorFlow writes and reads it; an absolute one stays."""
  prefix = codecs.escape_decode(escaped.encode())[0].decode(errors='replace')
  return os.path.join(model_dir, prefix)


def _is_inside(model_dir: str, prefix: str) -> bool:
  """Whether a checkpoint prefix lies directly in model_dir, as the run's
  manager writes them (another folder's may not be read or pruned)."""
  return ('\0' not in prefix and
          os.path.realpath(os.path.dirname(prefix)) ==
          os.path.realpath(model_dir))


def checkpoints_outside(model_dir: str) -> List[str]:
  """The paths model_dir's state file names outside model_dir."""
  text, _ = _state(model_dir)
  named = _LATEST.findall(text or '') + _KEPT.findall(text or '')
  return [prefix for prefix in (_named_prefix(model_dir, e) for e in named)
          if not _is_inside(model_dir, prefix)]


def _checkpoint(model_dir: str, escaped: str,
                written: float) -> Optional[LatestCheckpoint]:
  """The checkpoint a state file's field names, if its files are there in
  model_dir (one it names elsewhere is none of the run's)."""
  prefix = _named_prefix(model_dir, escaped)
  step = re.fullmatch(r'.*-(\d+)', os.path.basename(prefix))
  if not step or not _is_inside(model_dir, prefix) or not (
      os.path.exists(prefix + '.index') or
                      os.path.exists(prefix)):
    return None
  return LatestCheckpoint(prefix, int(step.group(1)), written)


def latest_checkpoint(model_dir: str) -> Optional[LatestCheckpoint]:
  """model_dir's latest checkpoint, or None where tf.train.latest_checkpoint
  finds none: no state file, one without a latest path, or one naming files
  that are gone."""
  if not model_dir:
    return None  # None given (a run then makes its own): not the cwd's.
  text, written = _state(model_dir)
  found = text and _LATEST.search(text)
  return _checkpoint(model_dir, found.group(1), written) if found else None


def kept_checkpoints(model_dir: str) -> List[LatestCheckpoint]:
  """Every checkpoint model_dir's state file keeps whose files are there,
  the latest first, then the others newest first: where a run resumes
  from when its latest does not read."""
  latest = latest_checkpoint(model_dir)
  text, written = _state(model_dir) if model_dir else (None, 0)
  kept = [_checkpoint(model_dir, escaped, written)
          for escaped in _KEPT.findall(text or '')]
  older = sorted({c for c in kept if c and c != latest},
                 key=lambda c: -c.step)
  return ([latest] if latest else []) + older

# A run's entries by name and kind, as a run of an earlier version (which
# kept no record of what it wrote) named them: ownership.py adopts those of
# such a directory. Besides the table above: what a write
# cut short leaves (TensorFlow's temporary shards of a checkpoint and its
# state file's temporary, the hidden temporary of an atomic write,
# resnet_keras/files.py, and an export's staging, serving/saved_model.py).
_RUN_FILES = re.compile(
    r'(?P<hidden>\.)?(%s)(?(hidden)\.tmp)' % '|'.join(map(re.escape, (
        CONFIG_FILE, WORLD_FILE, SCHEDULER_FILE, WARM_START_FILE,
        GOODPUT_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_STATE_FILE,
        VALIDATION_FILE, VALIDATION_EXPORTS_FILE, LOCK_FILE,
        RECORD_FILE))) +
    rf'|{CHECKPOINT_PREFIX}-\d+\.(index|data-\d+-of-\d+)'
    rf'|{CHECKPOINT_STATE_FILE}\.tmp[0-9a-f]*')
_RUN_DIRS = re.compile('|'.join(re.escape(name) for name in (
    SAVED_MODEL_DIR, PLOTS_DIR, TRAIN_SUMMARIES_DIR, EVAL_SUMMARIES_DIR,
    PROFILE_DIR, WANDB_DIR, EXPORTS_DIR, AVERAGED_DIR)) +
    rf'|{SAVED_MODEL_DIR}\.(partial|previous)'
    rf'|{CHECKPOINT_PREFIX}-\d+_temp.*|worker_\d+')


def is_run_entry(name: str, is_dir: bool) -> bool:
  """Whether a run writes an entry `name` (a folder if `is_dir`, else a
  file) in its model_dir."""
  return bool((_RUN_DIRS if is_dir else _RUN_FILES).fullmatch(name))
