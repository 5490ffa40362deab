"""Watchdogs: a thread that ends the process when a wait it watches has
lasted too long, where the waiting thread itself cannot be interrupted.

Two waits are watched. The training input from a tf.data service whose
workers are gone (data/input_service.py: the read blocks inside the
training loop's tf.function). And the job's collectives, waiting on a
worker frozen or stuck: Horovod's own stall check runs in the same
background loop as its negotiation, which waits for that worker too, so it
never fires; multi_worker_mirrored's collective timeout holds a thread per
collective until it passes (common/distribution.py). What the collective
watchdog polls is the backend's `Progress`, told by each step that the
collectives still move. The wait for every worker to join the job is
watched from a small process of its own too (`watched_from_outside`):
multi_worker_mirrored's start holds the GIL, so no thread here runs then.
"""

import contextlib
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, Optional

from absl import logging

from common.errors import STUCK_EXIT_CODE

# Seconds between two polls past which this process itself was stopped.
_SUSPENDED = 10


class Watchdog:
  """Calls `on_timeout(seconds)` (which must end the process) once a wait
  has lasted `timeout` seconds.

  A thread polls `waiting_since()`: the wall time (time.time()) at which
  the current wait began, 0 while nothing waits. timeout 0: never watches.
  A process frozen and resumed (its own polls far apart) does not blame
  the others for the time it was frozen: its wait counts from its resume.
  """

  def __init__(self, timeout: float, waiting_since: Callable[[], float],
               on_timeout: Callable[[float], None], poll: float = 1.0,
               clock: Callable[[], float] = time.time):
    self.timeout = timeout
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
      if since and now - max(since, resumed) > self.timeout:
        self._on_timeout(now - since)
        return


def stuck_line(worker_index: int, waited: float) -> str:
  """The line a worker ends itself with (the launcher's supervisor reads
  it to name the worker the others waited on)."""
  return (f'worker {worker_index}: the job\'s collectives have not moved for '
          f'{waited:.0f} s (the stuck-worker timeout, 10 x --failure_timeout):'
          ' another worker is frozen or stuck; ending this one so that the '
          'job ends (the launcher restarts it from the last checkpoint)')


def end_stuck_worker(worker_index: int) -> Callable[[float], None]:
  """The collective watchdog's `on_timeout`: one line, then this worker
  ends, so that the launcher sees the job fail and restarts it."""

  def end(waited: float) -> None:
    logging.error('%s', stuck_line(worker_index, waited))
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
