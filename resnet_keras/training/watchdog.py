"""Watchdogs: a thread that ends the process when a wait it watches has
lasted too long, where the waiting thread itself cannot be interrupted.

Two waits are watched. The training input from a tf.data service whose
workers are gone (data/input_service.py: the read blocks inside the
training loop's tf.function). And the job's collectives, waiting on a
worker frozen or stuck: Horovod's own stall check runs in the same
background loop as its negotiation, which waits for that worker too, so it
never fires; multi_worker_mirrored's collective timeout holds a thread per
collective until it passes (distribution.py). What the collective
watchdog polls is the backend's `Progress`, told by each step that the
collectives still move; how long a wait may last follows from how long the
same phase's steps took so far (`Deadlines`), so that a frozen worker is
named in seconds, not in the minutes a start-up or a checkpoint may take.
The wait for every worker to join the job is
watched from a small process of its own too (`watched_from_outside`):
multi_worker_mirrored's start holds the GIL, so no thread here runs then.
"""

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from common.errors import STUCK_EXIT_CODE

if TYPE_CHECKING:  # Imported for its type only: it loads TensorFlow.
  from resnet_keras.engine import distribution

# Seconds between two polls past which this process itself was stopped.
_SUSPENDED = 10


class Watchdog:
  """Calls `on_timeout(seconds)` (which must end the process) once a wait
  has lasted `timeout` seconds.

  A thread polls `waiting_since()`: the wall time (time.time()) at which
  the current wait began, 0 while nothing waits. timeout 0: never watches.
  A process frozen and resumed (its own polls far apart) does not blame
  the others for the time it was frozen: its wait counts from its resume.
  `deadline`: the current wait's timeout, where it is not always `timeout`.
  """

  def __init__(self, timeout: float, waiting_since: Callable[[], float],
               on_timeout: Callable[[float], None], poll: float = 1.0,
               clock: Callable[[], float] = time.time,
               deadline: Optional[Callable[[], float]] = None):
    self.timeout = timeout
    self._deadline = deadline or (lambda: timeout)
    self._clock = clock
    self._waiting_since, self._on_timeout = waiting_since, on_timeout
    self._poll = poll
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def start(self) -> 'Watchdog':
    if self.timeout and self._thread is None:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name='watchdog')
      self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def _watch(self):
    polled, resumed = self._clock(), 0.0
    while not self._stop.wait(self._poll):
      now = self._clock()
      if now - polled > max(_SUSPENDED, 10 * self._poll):
        # This process was itself stopped (SIGSTOP, a paused host): what
        # it waited for then says nothing of the others; it waits anew.
        resumed = now
      polled = now
      since = self._waiting_since()
      if since and now - max(since, resumed) > self._deadline():
        self._on_timeout(now - since)
        return


def deadline(durations: Sequence[float], multiple: float, quantile: float,
             floor: float, ceiling: float, min_samples: int) -> float:
  """Seconds a wait may last, from the `durations` the same waits took
  before: `multiple` x their `quantile` (0.99: the 99th percentile,
  interpolated), at least `floor` and at most `ceiling`; `ceiling` until
  there are `min_samples` of them."""
  if len(durations) < min_samples:
    return ceiling
  return min(ceiling, max(floor, multiple * float(
      np.quantile(np.asarray(durations, dtype=float), quantile))))


@dataclasses.dataclass(frozen=True)
class Rule:
  """How one phase's deadline follows from its waits so far (`deadline`):
  from the times between its beats (its steps), or, where nothing beats
  inside it, from the lengths of its earlier waits."""
  multiple: float
  quantile: float
  floor: float
  min_samples: int
  of_steps: bool

  def words(self, phase: str, base: float, floor: float) -> str:
    what = ('99th percentile of its step times' if self.of_steps else
            'longest of its earlier waits')
    return (f'the {phase} deadline: {self.multiple:g} x the {what} '
            f'({base:.2f} s), at least {floor:g} s')


# Frozen peers named within ~20 s where steps take up to 5 s; 4 x the 99th
# percentile leaves room for a slow step on a busy host (goodput counts
# those as stalls) without ending the job over it.
STEP_RULE = Rule(multiple=4, quantile=0.99, floor=20, min_samples=5,
                 of_steps=True)
# Phases not listed (joining, export, the waits at a run's start and stop)
# and a phase's later starts, before their steps settle, get the ceiling
# (10 x --failure_timeout): their time is restoring, a peer's start or its
# save; a phase's very first start gets TRACING_MULTIPLE x the ceiling.
RULES = {
    'training': STEP_RULE,
    'evaluation': STEP_RULE,
    # multi_worker_mirrored's collective saves: one wait each, no beats.
    'checkpoints': Rule(multiple=3, quantile=1.0, floor=60, min_samples=1,
                        of_steps=False),
}
# Steps between a wait's first two beats are its start (distribution.py
# Progress.beat): the ceiling holds until its second beat.
_STEADY_BEATS = 2
# A phase's very first start (no step of it timed yet) traces its loop:
# seconds that grow with the model and the machine's load, not with the
# network's failure timeout. Beside two busy processes and other jobs a
# tiny model's first loop outlasted a 45 s ceiling on 2 cores.
TRACING_MULTIPLE = 3


class Deadlines:
  """The deadline of the wait `progress` is in, by its phase's Rule, at most
  `ceiling`; a step's deadline is at least `step_floor` (a tf.data
  service's wait for a batch, which its own watchdog names first)."""

  def __init__(self, progress: 'distribution.Progress', ceiling: float,
               step_floor: float = 0.0, rules=None):
    self._progress = progress
    self.ceiling = ceiling
    self._step_floor = step_floor
    self._rules = RULES if rules is None else rules

  def now(self) -> float:
    return self.explained()[0]

  def explained(self) -> Tuple[float, str]:
    """The current wait's deadline in seconds, and the words saying why."""
    _, phase, beats = self._progress.current()
    rule = self._rules.get(phase)
    long = (self.ceiling, f'the {phase} deadline, 10 x --failure_timeout')
    if rule is None:
      return long
    if rule.of_steps and beats < _STEADY_BEATS:
      if self._progress.intervals(phase):
        return long
      return (TRACING_MULTIPLE * self.ceiling,
              f'the {phase} deadline while its first loop traces, '
              f'{TRACING_MULTIPLE} x 10 x --failure_timeout')
    durations = (self._progress.intervals(phase) if rule.of_steps else
                 self._progress.lengths(phase))
    floor = max(rule.floor, self._step_floor if rule.of_steps else 0)
    seconds = deadline(durations, rule.multiple, rule.quantile, floor,
                       self.ceiling, rule.min_samples)
    if seconds >= self.ceiling:
      return long
    base = float(np.quantile(durations, rule.quantile))
    return seconds, rule.words(phase, base, floor)


def stuck_line(worker_index: int, waited: float, why: str) -> str:
  """The line a worker ends itself with (the launcher's supervisor reads
  it to name the worker the others waited on); `why`: its deadline."""
  return (f'worker {worker_index}: the job\'s collectives have not moved for '
          f'{waited:.0f} s ({why}): another worker is frozen or stuck; '
          'ending this one so that the job ends (the launcher restarts it '
          'from the last checkpoint)')


def end_stuck_worker(worker_index: int, deadlines: Deadlines,
                     last_words: Sequence[Callable[[], None]] = ()
                     ) -> Callable[[float], None]:
  """The collective watchdog's `on_timeout`: `last_words` (the goodput
  account's last write), one line, then this worker ends, so that the
  launcher sees the job fail and restarts it."""

  def end(waited: float) -> None:
    for words in last_words:
      try:
        words()
      except Exception as e:  # pylint: disable=broad-except
        # Whatever failed there, the job must still end.
        logging.warning('before ending: %s', e)
    logging.error('%s', stuck_line(worker_index, waited,
                                   deadlines.explained()[1]))
    logging.flush()
    sys.stderr.flush()
    os._exit(STUCK_EXIT_CODE)  # pylint: disable=protected-access

  return end


# The outside watcher (plain Python, no TensorFlow): after `timeout` s of
# its parent's wait, not counting time the parent was itself stopped, it
# writes the stuck line to the job's output and kills the parent; it ends
# with its parent.
_OUTSIDE = """
import os, sys, time
parent, timeout, line = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def stopped():
  try:
    with open(f'/proc/{parent}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] in 'tT'
  except OSError:
    return False
waited = 0.0
while waited < timeout:
  time.sleep(0.5)
  if os.getppid() != parent:
    sys.exit(0)
  if not stopped():
    waited += 0.5
os.write(2, (time.strftime('%H:%M:%S') + ' E ' + line + chr(10)).encode())
os.kill(parent, 9)
"""


@contextlib.contextmanager
def watched_from_outside(timeout: float, line: str) -> Iterator[None]:
  """A wait the watchdog thread cannot see end: TensorFlow holds the GIL
  while multi_worker_mirrored's start waits for every worker to join, so
  no Python thread of this process runs until they have. A small process
  of its own watches it instead: after `timeout` s it writes `line` and
  kills this one (timeout 0: not watched)."""
  if not timeout:
    yield
    return
  watcher = subprocess.Popen(
      [sys.executable, '-c', _OUTSIDE, str(os.getpid()), str(timeout), line],
      stdin=subprocess.DEVNULL)
  try:
    yield
  finally:
    watcher.kill()
    watcher.wait()
