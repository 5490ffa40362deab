"""Checkpoints by time (--checkpoint_interval_seconds): a save at the first
loop boundary once the interval has passed since the last save, beside the
saves at epoch ends and --checkpoint_interval_steps.

The interval is the user's or, by default, the one that loses least to the
job's failures (Young 1974, Daly 2006): sqrt(2 x C x M), C the time a save
stalls the loop (the median of this process's saves so far, PRIOR_STALL
before its first) and M the job's mean time between failures (its wall time
over its earlier attempts, in model_dir/goodput.json; NO_FAILURE_MTBF while
it has none). Within [MIN_INTERVAL, MAX_INTERVAL], and at least
WRITE_MARGIN x the last write's own time: a save while the write before it
goes on waits for it. A job killed every two minutes with saves that stall
the loop 0.2 s gets one every ~10 s, a job without failures one every ~40 s.
"""

import math
import time
from typing import Callable, List, Optional, Sequence

import numpy as np

from resnet_keras.training import goodput

# Seconds a save stalls the loop, assumed before this process saved.
PRIOR_STALL = 1.0
# The mean time between failures assumed for a job that has had none.
NO_FAILURE_MTBF = 3600.0
MIN_INTERVAL = 10.0
MAX_INTERVAL = 1800.0
WRITE_MARGIN = 1.5


def young_daly(stall: float, mtbf: float) -> float:
  """The checkpoint interval that loses least: saving costs `stall` each,
  a failure (every `mtbf` s on average) half an interval of redone work."""
  return math.sqrt(2.0 * stall * mtbf)


def auto_interval(stalls: Sequence[float], write: float,
                  mtbf: float) -> float:
  """The default interval (module docstring) after saves that stalled the
  loop `stalls` s, the last written in `write` s in the background."""
  stall = float(np.median(stalls)) if len(stalls) else PRIOR_STALL
  interval = max(young_daly(stall, mtbf), WRITE_MARGIN * write)
  return min(max(interval, MIN_INTERVAL), MAX_INTERVAL)


def mean_time_between_failures(earlier_starts: Sequence[float],
                               now: float) -> float:
  """From the process starts of the job's earlier attempts (epoch seconds,
  oldest first), each ended by a failure or a stop: the job's wall time
  so far over them."""
  if not earlier_starts:
    return NO_FAILURE_MTBF
  return max(now - earlier_starts[0], 1.0) / len(earlier_starts)


def for_run(seconds: float, model_dir: str, is_chief: bool, saver,
            step: Callable[[], int], attempt,
            agree: Optional[Callable[[bool], bool]]) -> 'TimedSaves':
  """The action of a run's process, made before it is ready (goodput.json
  holds the earlier attempts alone): the chief reads the job's attempts;
  the other workers assume no failure (where saves are collective, the
  chief's earlier wish carries them)."""
  starts = ([a['process_start'] for a in goodput.read(model_dir)]
            if is_chief else [])
  mtbf = mean_time_between_failures(starts, time.time())
  return TimedSaves(seconds, mtbf, saver, step, attempt, agree)


class TimedSaves:
  """An orbit train action: a save once the interval passed since the last
  save (`saver`, checkpoints.Saver), every worker's clock combined
  (`agree`: any worker's flag, for backends whose saves are collective).
  `seconds`: the user's interval, or 0 for `auto_interval` over `mtbf`."""

  def __init__(self, seconds: float, mtbf: float, saver,
               step: Callable[[], int], attempt,
               agree: Optional[Callable[[bool], bool]],
               clock: Callable[[], float] = time.monotonic):
    self._seconds, self._mtbf, self._saver = seconds, mtbf, saver
    self._step, self._attempt, self._agree = step, attempt, agree
    self._clock = clock
    self._stalls: List[float] = []
    self._first_loop_end: Optional[float] = None

  def interval(self) -> float:
    if self._seconds:
      return self._seconds
    return auto_interval(self._stalls, self._saver.last_write_seconds,
                         self._mtbf)

  def __call__(self, output) -> None:
    del output
    now = self._clock()
    if self._first_loop_end is None:
      self._first_loop_end = now  # The first loop traced: not counted.
    since = max(self._saver.saved_at or 0.0, self._first_loop_end)
    due = now - since >= self.interval()
    if self._agree:
      due = self._agree(due)
    if due:
      self._stalls.append(self._saver.save(self._step(), self._attempt,
                                           ' (by time)'))
