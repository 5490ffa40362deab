"""resnet_keras/watchdog.py and the backend's Progress it polls: a wait
watched from a thread, or from a process of its own where the thread
cannot run, ended only when it lasts too long."""

import collections
import os
import re
import signal
import subprocess
import sys
import time

from common import distribution
from resnet_keras import watchdog
from tests.support import runner


def test_a_watchdog_ends_only_a_long_wait():
  now = time.time()
  waits = {'none': lambda: 0.0, 'short': lambda: time.time() - 0.05,
           'long': lambda: now - 10}
  fired = collections.defaultdict(list)
  dogs = [watchdog.Watchdog(1.0, since, fired[name].append,
                            poll=0.02).start()
          for name, since in waits.items()]
  time.sleep(0.3)
  for dog in dogs:
    dog.stop()
  assert not fired['none'] and not fired['short']
  assert len(fired['long']) == 1 and fired['long'][0] >= 10
  # timeout 0: never watches.
  assert watchdog.Watchdog(0, waits['long'], None).start()._thread is None


def test_progress_counts_a_wait_only_inside_the_collectives():
  progress = distribution.Progress()
  assert progress.waiting_since() == 0  # Outside: never stuck.
  with progress.waiting():
    entered = progress.waiting_since()
    assert entered > 0
    with progress.waiting():  # Nested: one wait.
      time.sleep(0.01)
      progress.beat()
      assert progress.waiting_since() > entered
    assert progress.waiting_since() > entered
  assert progress.waiting_since() == 0
  progress.beat()  # A beat outside a wait starts none.
  assert progress.waiting_since() == 0


def test_a_worker_waiting_on_a_frozen_one_is_ended_and_a_beating_one_not():
  fired = collections.defaultdict(list)
  progress = {name: distribution.Progress() for name in ('beating', 'frozen')}
  dogs = [watchdog.Watchdog(0.3, p.waiting_since, fired[name].append,
                            poll=0.02).start()
          for name, p in progress.items()]
  with progress['beating'].waiting(), progress['frozen'].waiting():
    deadline = time.time() + 0.8
    while time.time() < deadline:
      progress['beating'].beat()
      time.sleep(0.05)
  for dog in dogs:
    dog.stop()
  assert not fired['beating']
  assert len(fired['frozen']) == 1 and fired['frozen'][0] >= 0.3


def test_a_worker_that_was_frozen_itself_does_not_blame_the_others():
  """Its own polls far apart: the time it was stopped does not count; it
  waits a whole timeout from its resume before it ends."""
  now = [1000.0]
  fired = []
  dog = watchdog.Watchdog(5, lambda: 1000.0, fired.append, poll=0.01,
                          clock=lambda: now[0])
  dog.start()
  time.sleep(0.05)
  now[0] += 120  # Frozen for two minutes, then resumed.
  time.sleep(0.1)
  assert not fired
  now[0] += 6  # A whole timeout after its resume, still no answer.
  deadline = time.time() + 5
  while not fired and time.time() < deadline:
    time.sleep(0.01)
  dog.stop()
  assert fired and fired[0] >= 126


_WAITER = ('import sys, time\n'
           'from resnet_keras import watchdog\n'
           'with watchdog.watched_from_outside(float(sys.argv[1]), "stuck"):\n'
           '  print("waiting", flush=True)\n'
           '  time.sleep(float(sys.argv[2]))\n')


def _waiter(timeout, sleep):
  return subprocess.Popen([sys.executable, '-c', _WAITER, str(timeout),
                           str(sleep)], cwd=runner.REPO_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def test_a_wait_watched_from_outside_that_ends_in_time_is_left_alone():
  waiter = _waiter(5, 0.2)
  out, err = waiter.communicate(timeout=60)
  assert waiter.returncode == 0 and 'stuck' not in err, err


def test_a_wait_watched_from_outside_that_lasts_ends_its_process_in_a_line():
  """The process itself cannot act (TensorFlow holds the GIL): its
  watcher writes the line and kills it, not counting the time the process
  was itself stopped."""
  waiter = _waiter(1.5, 60)
  assert waiter.stdout.readline() == 'waiting\n'
  os.kill(waiter.pid, signal.SIGSTOP)
  time.sleep(3)  # Stopped for longer than the timeout: still not ended.
  assert waiter.poll() is None
  os.kill(waiter.pid, signal.SIGCONT)
  _, err = waiter.communicate(timeout=30)
  assert waiter.returncode == -signal.SIGKILL
  assert re.fullmatch(r'\d\d:\d\d:\d\d E stuck\n', err), err
