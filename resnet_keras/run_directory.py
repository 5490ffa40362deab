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
                         stopped it (job_starts.py)
  warm_start.json        where a warm start began (start.py)
  goodput.json           each attempt's timings, the job's goodput
                         (goodput.py)
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

`clean` is --clean's one deletion: it removes these entries and nothing
else, and refuses, before removing anything, a model_dir that holds
anything else (`foreign_entries`).

This module never imports TensorFlow: the launcher reads model_dir through
it before TensorFlow loads.
"""

import codecs
import dataclasses
import os
import re
import shutil
from typing import List, Optional

from common.errors import UsageError

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


def _checkpoint(model_dir: str, escaped: str,
                written: float) -> Optional[LatestCheckpoint]:
  """The checkpoint a state file's field names, if its files are there. A
  relative path is relative to model_dir, as TensorFlow writes and reads
  it."""
  prefix = codecs.escape_decode(escaped.encode())[0].decode()
  prefix = os.path.join(model_dir, prefix)  # an absolute prefix stays
  step = re.fullmatch(r'.*-(\d+)', os.path.basename(prefix))
  if not step or not (os.path.exists(prefix + '.index') or
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

# A run's entries by name and kind. Besides the table above: what a write
# cut short leaves (TensorFlow's temporary shards of a checkpoint and its
# state file's temporary, the hidden temporary of an atomic write,
# common/files.py, and an export's staging, serving/saved_model.py).
_RUN_FILES = re.compile(
    r'(?P<hidden>\.)?(%s)(?(hidden)\.tmp)' % '|'.join(map(re.escape, (
        CONFIG_FILE, WORLD_FILE, SCHEDULER_FILE, WARM_START_FILE,
        GOODPUT_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_STATE_FILE, VALIDATION_FILE,
        VALIDATION_EXPORTS_FILE))) +
    rf'|{CHECKPOINT_PREFIX}-\d+\.(index|data-\d+-of-\d+)'
    rf'|{CHECKPOINT_STATE_FILE}\.tmp[0-9a-f]*')
_RUN_DIRS = re.compile('|'.join(re.escape(name) for name in (
    SAVED_MODEL_DIR, PLOTS_DIR, TRAIN_SUMMARIES_DIR, EVAL_SUMMARIES_DIR,
    PROFILE_DIR, WANDB_DIR, EXPORTS_DIR, AVERAGED_DIR)) +
    rf'|{SAVED_MODEL_DIR}\.(partial|previous)'
    rf'|{CHECKPOINT_PREFIX}-\d+_temp.*|worker_\d+')
# How many foreign entries --clean's refusal names.
_NAMED = 3


def is_run_entry(name: str, is_dir: bool) -> bool:
  """Whether a run writes an entry `name` (a folder if `is_dir`, else a
  file) in its model_dir."""
  return bool((_RUN_DIRS if is_dir else _RUN_FILES).fullmatch(name))


def _entries(model_dir: str) -> List[os.DirEntry]:
  try:
    return list(os.scandir(model_dir))
  except (FileNotFoundError, NotADirectoryError):
    return []


def _is_runs(entry: os.DirEntry) -> bool:
  """A symbolic link is never a run's: a run writes none, and --clean must
  not reach through one."""
  if entry.is_symlink():
    return False
  is_dir = entry.is_dir(follow_symlinks=False)
  return ((is_dir or entry.is_file(follow_symlinks=False)) and
          is_run_entry(entry.name, is_dir))


def foreign_entries(model_dir: str) -> List[str]:
  """model_dir's entries no run writes, sorted, folders ending in '/'
  ([] for an absent directory)."""
  return sorted(entry.name + ('/' if entry.is_dir() else '')
                for entry in _entries(model_dir) if not _is_runs(entry))


def check_cleanable(model_dir: str) -> None:
  """Refuses, in one line, a --clean of a model_dir holding anything a run
  does not write: --clean deletes only a run's own files."""
  foreign = foreign_entries(model_dir)
  if not foreign:
    return
  named = ', '.join(foreign[:_NAMED])
  more = f' and {len(foreign) - _NAMED} more' if len(foreign) > _NAMED else ''
  raise UsageError(
      f'--clean: --model_dir={model_dir} holds what no run writes ({named}'
      f'{more}); nothing was removed: choose an empty or new --model_dir, '
      'or move those away yourself')


def clean(model_dir: str) -> List[str]:
  """--clean: after `check_cleanable`, removes the run's entries from
  model_dir and returns their names. The directory itself stays (its
  owner, permissions, or a mount or link there are the user's). Nothing
  is reached through a symbolic link: one in model_dir is refused, and
  shutil.rmtree removes those inside a run's folders as links."""
  check_cleanable(model_dir)
  removed = []
  for entry in _entries(model_dir):
    if not _is_runs(entry):
      continue  # Appeared since the check: not ours to remove.
    if entry.is_dir(follow_symlinks=False):
      shutil.rmtree(entry.path)
    else:
      os.remove(entry.path)
    removed.append(entry.name)
  return sorted(removed)
