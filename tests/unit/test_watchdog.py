"""resnet_keras/watchdog.py and the backend's Progress it polls: a wait
watched from a thread, ended only when it lasts too long."""

import collections
import time

from common import distribution
from resnet_keras import watchdog


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
