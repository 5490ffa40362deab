"""Goodput: the share of a job's wall-clock time that went into steps that
count, over all its attempts (the first start, restarts, requeues, reruns
by hand on the same model_dir).

Each attempt keeps its own account (`Attempt`): when its process started,
when its start-up ended (it was ready to train), the time its training
calls, checkpoint writes, evaluations and export took, its steps and where
they began. The chief writes it to model_dir/goodput.json as it goes,
appended to the earlier attempts' records: when it is ready, after each
checkpoint and evaluation, after a loop once WRITE_EVERY seconds have
passed since the last write, when a signal stops it and at its end. An
attempt killed with -9 so leaves its account up to its last write, and the
time after that falls in the wait before the next attempt.

The arithmetic (`split`, `sentence`) is pure functions of those records.
The job's wall time runs from its first attempt's process start to the
last attempt's last record, split into:

  productive   training calls, less the two below
  redone       steps this attempt trains again that an earlier attempt had
               already trained (it resumed from an earlier checkpoint than
               that attempt's last step), at the attempt's own step time
  stalled      steps that took far longer than the usual step (a frozen,
               slow or lost peer, a pause of this host): their time beyond
               the usual (`stalled_seconds`)
  startup      process start to the first training call, plus the first
               loop's time beyond what its steps take in later loops
               (tracing, the input pipeline's start), as ml-goodput-
               measurement counts a first step's compilation
  checkpoints  the time the loop waited for its saves: the values'
               copy, a wait for the write before, the wait at the end for
               the last one
  evaluation, export   their own calls
  waiting      from an attempt's last record to the next one's process
               start: restart gaps, a scheduler's requeue hold, a killed
               attempt's time after its last record
  other        the rest, so the parts add up to the wall time: the
               attempt's end (TensorBoard and metrics files closed, plots
               drawn), progressive resizing's new input, the host's work
               between calls

Beside the parts, not one of them (training went on meanwhile): the time
the checkpoints' writes took in the background (`checkpoint_written`), the
block's `checkpoint_writes_seconds`.

This module never imports TensorFlow.
"""

import contextlib
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from resnet_keras import files
from resnet_keras.files import write_json_atomically
from resnet_keras.rundir import run_directory
from resnet_keras.engine.metrics import LOOP_RECORD

# The parts of the wall time, in the order the sentence says them.
PARTS = ('productive', 'redone', 'stalled', 'startup', 'checkpoints',
         'evaluation', 'export', 'waiting', 'other')
# The phases an attempt times itself (its records' keys, in seconds).
PHASES = ('training', 'checkpoints', 'evaluation', 'export')
# Seconds between writes after loops alone: a killed attempt's record is at
# most this old (plus a loop), without a write per loop of short steps.
WRITE_EVERY = 5.0
# A step stalled when it took more than STALL_FACTOR x the median of the
# steps before it and STALL_MIN_SECONDS more: a loop's end (the chief's log
# line and files, a few tens of ms) and the jitter of a busy host stay
# productive. Fewer than STALL_MIN_STEPS earlier steps: no usual yet.
STALL_FACTOR = 2.0
STALL_MIN_SECONDS = 0.5
STALL_MIN_STEPS = 5


def read(model_dir: str) -> List[Dict]:
  """The attempts recorded in model_dir, oldest first (none: a run from
  before this file, or a new one).

  A damaged file (cut short, not JSON, a record of the wrong shape) is
  passed over with one warning, keeping the attempts that read: it is
  only an account of the time, which no step depends on, and a run that
  refused to resume over it would lose more time than the account
  measures. The next write replaces it with what was read."""
  path = os.path.join(model_dir, run_directory.GOODPUT_FILE)
  attempts, why = files.read_records(path, _readable)
  if why:
    logging.warning('%s is damaged (%s): the job\'s goodput counts the %d '
                    'attempts that read, and this one', path, why,
                    len(attempts))
  return attempts


def _readable(attempt) -> bool:
  """Whether `attempt` has what `split` reads, of the types it reads (an
  attempt of code before `stalled` or `checkpoint_writes` has none: 0)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  pair = lambda v: isinstance(v, list) and len(v) == 2 and all(map(number, v))
  return (isinstance(attempt, dict) and
          all(number(attempt.get(k)) for k in (
              'process_start', 'ready', 'end', 'start_step', 'last_step',
              *PHASES)) and number(attempt.get('stalled', 0.0)) and
          number(attempt.get('checkpoint_writes', 0.0)) and
          pair(attempt.get('first_loop')) and pair(attempt.get('loops')))


def stalled_seconds(interval: float, earlier: Sequence[float]) -> float:
  """A step's seconds beyond the usual step (the median of the `earlier`
  steps' times) where it stalled (STALL_FACTOR, STALL_MIN_SECONDS), else
  0: the time it waited on a peer frozen, slow or lost, or was paused."""
  if len(earlier) < STALL_MIN_STEPS:
    return 0.0
  usual = float(np.median(np.asarray(earlier, dtype=float)))
  excess = interval - usual
  stalled = interval > STALL_FACTOR * usual and excess >= STALL_MIN_SECONDS
  return excess if stalled else 0.0


def first_loop_excess(first: Tuple[int, float],
                      loops: Tuple[int, float]) -> float:
  """The first loop's seconds beyond what its steps take in the loops after
  it; `first` and `loops` (every loop, the first included) are (steps,
  seconds). 0 without a later loop to compare with."""
  later_steps, later_seconds = loops[0] - first[0], loops[1] - first[1]
  if not first[0] or later_steps <= 0:
    return 0.0
  return max(0.0, first[1] - first[0] * later_seconds / later_steps)


def redone_steps(earlier_last_step: int, start_step: int,
                 last_step: int) -> int:
  """The steps an attempt that resumed at `start_step` and trained to
  `last_step` trained again, earlier attempts having trained up to
  `earlier_last_step`."""
  return max(0, min(earlier_last_step, last_step) - start_step)


def attempt_parts(attempt: Dict, earlier_last_step: int
                  ) -> Tuple[Dict[str, float], int]:
  """One attempt's seconds in each part but waiting and other, and the
  steps it redid. Its stalls are not productive, nor redone: redone steps
  are counted at the pace of its steps less their stalls."""
  excess = min(first_loop_excess(attempt['first_loop'], attempt['loops']),
               attempt['training'])
  stalled = min(attempt.get('stalled', 0.0), attempt['training'] - excess)
  steps_seconds = attempt['training'] - excess - stalled
  trained = attempt['last_step'] - attempt['start_step']
  redone = redone_steps(earlier_last_step, attempt['start_step'],
                        attempt['last_step'])
  redone_seconds = steps_seconds * redone / trained if trained > 0 else 0.0
  return {'productive': steps_seconds - redone_seconds,
          'redone': redone_seconds,
          'stalled': stalled,
          'startup': attempt['ready'] - attempt['process_start'] + excess,
          'checkpoints': attempt['checkpoints'],
          'evaluation': attempt['evaluation'],
          'export': attempt['export']}, redone


def split(attempts: List[Dict]) -> Dict:
  """run_summary.json's goodput block for a job of `attempts` (records,
  oldest first): the wall time, its parts (which add up to it: `other`
  takes what no named part holds), goodput = productive / wall, and each
  attempt's own goodput: its productive time over its stretch of the wall
  (from the previous attempt's last record, the wait between them
  included; the first's from its process start)."""
  seconds = dict.fromkeys(PARTS, 0.0)
  redone_total, earlier_last_step, previous_end = 0, 0, None
  per_attempt = []
  for attempt in attempts:
    if previous_end is not None:
      # Negative only between hosts whose clocks disagree: other keeps it.
      seconds['waiting'] += max(0.0, attempt['process_start'] - previous_end)
    parts, redone = attempt_parts(attempt, earlier_last_step)
    for part, value in parts.items():
      seconds[part] += value
    stretch = attempt['end'] - (attempt['process_start'] if previous_end is None
                                else previous_end)
    per_attempt.append(round(parts['productive'] / stretch, 4)
                       if stretch > 0 else None)
    redone_total += redone
    earlier_last_step = max(earlier_last_step, attempt['last_step'])
    previous_end = attempt['end']
  wall = attempts[-1]['end'] - attempts[0]['process_start']
  seconds['other'] = wall - sum(v for k, v in seconds.items() if k != 'other')
  return {'goodput': round(seconds['productive'] / wall, 4) if wall > 0
                     else None,
          'wall_seconds': round(wall, 3),
          'attempts': len(attempts),
          'redone_steps': redone_total,
          'seconds': {k: round(v, 3) for k, v in seconds.items()},
          'per_attempt': per_attempt,
          'checkpoint_writes_seconds': round(sum(
              a.get('checkpoint_writes', 0.0) for a in attempts), 3)}


def _seconds(value: float) -> str:
  return f'{value:.0f} s' if abs(value) >= 10 else f'{value:.1f} s'


def sentence(block: Dict) -> str:
  """The goodput block in words: a run's last log line."""
  seconds, attempts = block['seconds'], block['attempts']
  share = (f'{100 * block["goodput"]:.0f}%' if block['goodput'] is not None
           else 'n/a')
  return (
      f'goodput {share}: {_seconds(seconds["productive"])} of '
      f'{_seconds(block["wall_seconds"])} wall in productive steps; start-up '
      f'{_seconds(seconds["startup"])} ({attempts} attempt'
      f'{"s" if attempts != 1 else ""}), redone {_seconds(seconds["redone"])} '
      f'({block["redone_steps"]} steps), stalled '
      f'{_seconds(seconds["stalled"])}, checkpoints '
      f'{_seconds(seconds["checkpoints"])}, evaluation '
      f'{_seconds(seconds["evaluation"])}, export '
      f'{_seconds(seconds["export"])}, waiting {_seconds(seconds["waiting"])}'
      f', other {_seconds(seconds["other"])}')


class Attempt:
  """This attempt's account; an orbit train action (each loop's steps and
  seconds). With a `model_dir` (the chief's) it is written there, after
  the earlier attempts' records. `stalled`: the seconds its training steps
  have stalled so far (the backend's Progress)."""

  def __init__(self, model_dir: Optional[str], process_start: float,
               start_step: int, stalled: Callable[[], float] = lambda: 0.0):
    self._path = (os.path.join(model_dir, run_directory.GOODPUT_FILE)
                  if model_dir else None)
    self._earlier = read(model_dir) if model_dir else []
    self._stalled = stalled
    self.record = {'process_start': process_start, 'ready': None,
                   'end': process_start, 'start_step': start_step,
                   'last_step': start_step, 'first_loop': [0, 0.0],
                   'loops': [0, 0.0], **dict.fromkeys(PHASES, 0.0),
                   'stalled': 0.0, 'checkpoint_writes': 0.0}
    self._open = {}  # phase -> time.monotonic() it began, while it runs
    self._written = time.monotonic()

  def ready(self) -> None:
    """Start-up is over: training begins."""
    self.record['ready'] = time.time()
    self.write()

  @contextlib.contextmanager
  def timing(self, phase: str):
    """Adds the time of the block to `phase` (one of PHASES)."""
    begun = self._open[phase] = time.monotonic()
    try:
      yield
    finally:
      del self._open[phase]
      self.record[phase] += time.monotonic() - begun

  def checkpoint_written(self, seconds: float) -> None:
    """A checkpoint's write took `seconds` in the background (any thread)."""
    self.record['checkpoint_writes'] += seconds

  def __call__(self, output: Dict) -> None:
    loop = output[LOOP_RECORD]
    steps = len(loop.losses)
    if not steps:
      return
    if not self.record['first_loop'][0]:
      self.record['first_loop'] = [steps, loop.seconds]
    self.record['loops'] = [self.record['loops'][0] + steps,
                            self.record['loops'][1] + loop.seconds]
    self.record['last_step'] = loop.first_step + steps - 1
    if time.monotonic() - self._written >= WRITE_EVERY:
      self.write()

  def write(self) -> Dict:
    """Ends the record now, a phase in progress counted to now (an attempt
    killed in a training call of many loops keeps their time); the chief
    writes the attempts so far. Returns the record as written."""
    now = time.monotonic()
    self.record['end'] = time.time()
    self.record['stalled'] = self._stalled()
    record = dict(self.record)
    for phase, begun in list(self._open.items()):
      record[phase] += now - begun
    if self._path:
      write_json_atomically(self._path, self._earlier + [record])
    self._written = now
    return record

  def job(self) -> Dict:
    """The goodput block of the job up to now (this attempt's end)."""
    return split(self._earlier + [self.write()])
