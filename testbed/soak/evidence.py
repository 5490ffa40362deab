"""Reading what a soak job left (runner.py): its log (resumes,
shrinks, the line that named the fault) and its model directory
(checkpoint files, which of them read, run_summary.json, the weights'
drift from an uninterrupted run), into its JobRecord; and the kernel's
word on a process (what shows a signal landed). Tested in
tests/unit/test_soak_evidence.py.
"""

import bisect
import hashlib
import json
import os
import re
import shutil
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from testbed.soak.invariants import JobRecord, Restart, wrong_end
from testbed.soak.plan import JobPlan

T = TypeVar('T')
_STEP = re.compile(r' I step (\d+)/')
_RESUMED = re.compile(r'restored from \S+ at step (\d+)')
# The launcher's lines that name a fault.
NAMING = (r'job failed|job stopped by|Slurm lost node|requeued|no space left|'
          r'the chief finished the run')
_NAMED = re.compile(NAMING + r'|^error:|the job ends')


def process_state(pid: int) -> str:
  """The kernel's state letter of `pid` (R, S, T stopped, Z ended but not
  yet reaped...), or '' once it is gone."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      stat = f.read()
  except OSError:
    return ''
  # The command name, in parentheses, may itself hold spaces or ')'.
  return stat[stat.rindex(')') + 2:].split(' ', 1)[0]


def wait_for(observe: Callable[[], T], done: Callable[[T], bool],
             seconds: float) -> T:
  """What `observe` says once `done` holds of it, or after `seconds`."""
  deadline = time.monotonic() + seconds
  seen = observe()
  while not done(seen) and time.monotonic() < deadline:
    time.sleep(0.05)  # A signal's or a command's effect, polled.
    seen = observe()
  return seen


def lines_after(log, at: float) -> List[str]:
  """The lines of `log` (a jobs.Log) first seen at or after `at`."""
  return log.lines[bisect.bisect_left(log.seen, at):]


def resumes_in(lines: Sequence[str]) -> List[Tuple[int, int]]:
  """(last step logged before, step restored at) for each resume."""
  found, reached = [], 0
  for line in lines:
    step = _STEP.search(line)
    if step:
      reached = max(reached, int(step.group(1)))
    resumed = _RESUMED.search(line)
    if resumed and reached:
      found.append((reached, int(resumed.group(1))))
      reached = 0
  return found


_SAVED = re.compile(r'saved checkpoint (?:\S*ckpt-(\d+)$|at step (\d+))')
_REQUEUED = re.compile(r'requeued \d+ time\(s\) by the scheduler')
# Where a new attempt starts: the launcher's restart, its stop for a
# dropped host's return (an elastic job grows back), or Slurm's requeue.
_RESTART = re.compile(r'restart \d+ of|answer again: the workers save|' +
                      _REQUEUED.pattern)
_TRAINED = re.compile(_STEP.pattern + r'|eval at step')


def restarts_in(lines: Sequence[str]) -> List[Restart]:
  """Each restart's (or requeue's) attempt: the checkpoints saved before
  it, the step it restored before it trained, and whether it trained."""
  found, saved = [], []
  for line in lines:
    kept = _SAVED.search(line)
    if kept:
      saved.append(int(kept.group(1) or kept.group(2)))
    elif _RESTART.search(line):
      found.append(Restart(tuple(saved), None, False))
    elif found and not found[-1].trained:
      resumed = _RESUMED.search(line)
      if resumed:
        found[-1] = found[-1]._replace(resumed=int(resumed.group(1)))
      elif _TRAINED.search(line):
        found[-1] = found[-1]._replace(trained=True)
  return found


def _first(lines: Sequence[str], pattern, start: int) -> Optional[int]:
  return next((i for i in range(start, len(lines))
               if pattern.search(lines[i])), None)


def recovery_seconds(log, at: float) -> Optional[float]:
  """Seconds from a fault at `at` to the job's next productive step: the
  first step logged after the restart (or requeue) that followed it, or
  after the fault where none did (a fault passed without one); None: no
  step followed. By line order, not by when lines were seen: one poll sees
  many at once."""
  first = bisect.bisect_left(log.seen, at)
  restart = _first(log.lines, _RESTART, first)
  step = _first(log.lines, _STEP, first if restart is None else restart + 1)
  return None if step is None else log.seen[step] - at


_CHANGE = re.compile(r'the job (?:shrinks|grows) .*(?:resuming at step|from '
                     r'step) (\d+)')


def world_changes(lines: Sequence[str]) -> List[int]:
  """The step each shrink or regrowth in the log resumes at."""
  return [int(m.group(1)) for line in lines for m in [_CHANGE.search(line)]
          if m]


def last_line(lines: Sequence[str]) -> str:
  meaningful = [line for line in lines
                if line.strip() and 'port guard' not in line]
  return meaningful[-1] if meaningful else ''


def is_named(line: str) -> bool:
  return bool(_NAMED.search(line))


def outcome(code: Optional[int], plan: JobPlan, lines: Sequence[str]) -> str:
  if code is None:
    return 'HANG'
  if code == 0:
    return 'completed'
  if any(name == 'kill_launcher' for name, _ in plan.faults):
    return 'killed'
  if plan.placement == 'slurm':
    # The batch script's output ends with the launcher's line, or with
    # Slurm's own for a job it cancelled.
    tail = [l for l in lines if 'port guard' not in l][-5:]
    return 'named' if any(is_named(l) or 'CANCELLED' in l
                          for l in tail) else 'unnamed'
  return 'named' if is_named(last_line(lines)) else 'unnamed'


def read_results(record: JobRecord, log, model_dir: str,
                 last_fault: float) -> None:
  """Fills `record` from the job's log (a jobs.Log) and model_dir."""
  lines = log.lines
  record.last_line = last_line(lines)
  record.resumes = resumes_in(lines)
  record.restarts = restarts_in(lines)
  requeued = [i for i, l in enumerate(lines) if _REQUEUED.search(l)]
  record.requeues_logged = len(requeued)
  # A requeued job's launcher starts counting its restarts again; a
  # regrowth restarts the workers too (run_summary.json counts both).
  record.restarts_logged = sum(
      bool(re.search(r'restart \d+ of|answer again: the workers save', l))
      for l in lines[requeued[-1] if requeued else 0:])
  record.world_changes = world_changes(lines)
  record.shrank = bool(record.world_changes)
  named = log.first(NAMING, after=last_fault)
  if named is not None:
    record.seconds_to_named = named - last_fault
  restart = log.first(_RESTART.pattern, after=last_fault)
  if restart is not None:
    step = log.first(r' I step \d+/', after=restart)
    if step is not None:
      record.restart_to_step = step - restart
  record.files_after = checkpoint_files(model_dir)
  record.readable_after = readable(model_dir)
  summary = read_summary(model_dir)
  if summary:
    record.weights = summary.get('weights_sha256')
    record.summary_restarts = summary.get('restarts')
    record.summary_world_sizes = len(summary.get('world_sizes') or []) or None
    scheduler = summary.get('scheduler') or {}
    record.summary_requeues = scheduler.get('requeues')
    goodput = summary.get('goodput')
    if isinstance(goodput, dict):
      record.goodput = goodput.get('goodput')
  record.summary_steps = summary.get('train_steps')
  if record.outcome == 'completed' and wrong_end(record.summary_steps,
                                                 record.plan.steps):
    record.outcome = 'wrong end'


def checkpoint_files(model_dir: str) -> Dict[str, str]:
  """name -> sha256 of the files of the checkpoints the state file keeps."""
  from resnet_keras.rundir import run_directory  # pylint: disable=g-import-not-at-top
  found = {}
  for checkpoint in run_directory.kept_checkpoints(model_dir):
    prefix = os.path.basename(checkpoint.prefix)
    for name in os.listdir(model_dir):
      if name.startswith(prefix + '.'):
        with open(os.path.join(model_dir, name), 'rb') as f:
          found[name] = hashlib.sha256(f.read()).hexdigest()
  return found


def copy_checkpoints(model_dir: str, into: str) -> None:
  """model_dir's checkpoints as they are (read later: reading takes long,
  and the job goes on writing)."""
  if not os.path.isdir(model_dir):
    return
  # What a write in progress holds (a checkpoint's temporary folder, an
  # atomic write's temporary, the lock) may vanish while it is copied: such
  # entries are left out, and a copy that met one gone is taken again.
  ignore = shutil.ignore_patterns(
      'saved_model*', 'worker_*', 'filler', '*.json*', 'plots', '*_temp*',
      '.*.tmp', 'run.lock*', 'run_files.txt')
  for attempt in range(5):
    shutil.rmtree(into, ignore_errors=True)
    try:
      shutil.copytree(model_dir, into, ignore=ignore)
      return
    except shutil.Error:
      if attempt == 4:
        raise
      time.sleep(0.2)


def readable(model_dir: str) -> List[int]:
  from resnet_keras.rundir import checkpoints, run_directory  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(model_dir):
    return []
  return sorted(c.step for c in run_directory.kept_checkpoints(model_dir)
                if checkpoints.unreadable(c.prefix) is None)


def _model_weights(prefix: str) -> Dict[str, np.ndarray]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name, _ in tf.train.list_variables(prefix)
          if name.startswith('model/') and 'OPTIMIZER_SLOT' not in name}


def weights_drift(model_dir: str, reference_dir: str) -> Optional[float]:
  """|w - w_ref| / |w_ref - w_ref(oldest checkpoint)| over the model's
  variables at each run's latest checkpoint (None: one does not read)."""
  from resnet_keras.rundir import run_directory  # pylint: disable=g-import-not-at-top
  kept = run_directory.kept_checkpoints(reference_dir)
  newest = run_directory.latest_checkpoint(model_dir)
  if len(kept) < 2 or newest is None:
    return None
  try:
    final, first, ours = (_model_weights(p) for p in (
        kept[0].prefix, kept[-1].prefix, newest.prefix))
  except Exception:  # pylint: disable=broad-except
    return None  # An unreadable checkpoint is check_data's to report.
  squared = lambda pairs: sum(float(((a - b) ** 2).sum()) for a, b in pairs)
  travel = squared((final[n], first[n]) for n in final)
  if not travel or set(ours) != set(final):
    return None
  return (squared((ours[n], final[n]) for n in final) / travel) ** 0.5


def reference_problem(code: Optional[int], summary: Dict, steps: int) -> str:
  """Why an uninterrupted run gives no weights to compare with ('': it
  does)."""
  if code is None:
    return 'no end'
  if code:
    return f'exit {code}'
  why = wrong_end(summary.get('train_steps'), steps)
  if why:
    return why
  if not summary.get('weights_sha256'):
    return 'run_summary.json records no weights_sha256'
  return ''


def read_summary(model_dir: str) -> Dict:
  try:
    with open(os.path.join(model_dir, 'run_summary.json')) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}
