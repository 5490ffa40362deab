"""resnet_keras/training/watchdog.py and the backend's Progress it polls: a wait
watched from a thread, or from a process of its own where the thread
cannot run, ended only when it lasts too long."""

import collections
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from resnet_keras.engine import distribution
from resnet_keras.training import watchdog
from resnet_keras.launcher import failures
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


@pytest.mark.parametrize('durations, ceiling, expected', [
    # A slow step among steady ones moves the 99th percentile a little:
    # sorted, it sits at 0.99 x 4 = 3.96 of the way, 0.5 + 0.96 x 2.5 =
    # 2.9 s; 4 x that is 11.6 s, below the floor.
    ([0.5, 0.5, 3.0, 0.5, 0.5], 600, 20.0),
    ([6.0] * 10, 600, 24.0),  # Steps of 6 s: 4 x 6.
    ([1.0] * 100 + [50.0], 600, 20.0),  # One stall in 101: p99 is 1 s.
    ([7.0] * 100 + [50.0], 600, 28.0),
    (list(range(1, 101)), 120, 120.0),  # p99 99.01 s: 396 s, capped.
    ([0.1] * 4, 600, 600.0),  # Too few steps to know: the ceiling.
])
def test_a_deadline_is_a_multiple_of_the_high_percentile_with_a_floor(
    durations, ceiling, expected):
  assert watchdog.deadline(durations, multiple=4, quantile=0.99, floor=20,
                           ceiling=ceiling, min_samples=5) == \
      pytest.approx(expected)


def _beats(progress, seconds, count):
  for _ in range(count):
    progress.beat()
    time.sleep(seconds)


def test_progress_keeps_each_phases_steps_from_a_waits_second_beat():
  progress = distribution.Progress()
  with progress.waiting('training'):
    assert progress.current()[1:] == ('training', 0)
    _beats(progress, 0.01, 4)
    with progress.waiting():  # The loop's own collectives: training's.
      progress.beat()
  # The first two beats end the wait's start: three intervals after them.
  steps = progress.intervals('training')
  assert len(steps) == 3 and all(0.005 < s < 1 for s in steps[:2])
  with progress.waiting('checkpoints'):
    time.sleep(0.05)
  assert progress.lengths('checkpoints')[0] >= 0.05
  assert progress.lengths('training') == [] and progress.current()[0] == 0


def test_deadlines_by_phase_the_start_long_then_from_the_steps():
  progress = distribution.Progress()
  deadlines = watchdog.Deadlines(progress, ceiling=600)
  with progress.waiting('training'):
    # Its first loop traces: three times the ceiling, said so.
    assert deadlines.explained() == (
        1800, 'the training deadline while its first loop traces, '
        '3 x 10 x --failure_timeout')
    _beats(progress, 0.001, 2)
    assert deadlines.now() == 600  # Started, no steps timed yet.
    _beats(progress, 0.001, 5)
    seconds, why = deadlines.explained()
    assert seconds == 20
    assert re.fullmatch(r'the training deadline: 4 x the 99th percentile of '
                        r'its step times \(0\.0\d s\), at least 20 s', why)
  with progress.waiting('training'):  # A new call starts long again.
    progress.beat()
    assert deadlines.now() == 600
  with progress.waiting('export'):
    assert deadlines.explained() == (
        600, 'the export deadline, 10 x --failure_timeout')
  with progress.waiting('checkpoints'):
    assert deadlines.now() == 600  # The first checkpoint.
  with progress.waiting('checkpoints'):
    assert deadlines.now() == 60  # 3 x its length, at least 60 s.
  # A tf.data service's own wait for a batch (300 s) comes first.
  served = watchdog.Deadlines(progress, ceiling=600, step_floor=300)
  with progress.waiting('training'):
    _beats(progress, 0.001, 3)
    assert served.now() == 300


def test_a_frozen_peer_is_named_after_the_steps_deadline_not_the_ceiling():
  """Steps of 20 ms, then none: the watchdog fires after its floor (0.3 s
  here; 20 s in a run), not its ceiling (30 s)."""
  progress = distribution.Progress()
  rule = watchdog.Rule(multiple=4, quantile=0.99, floor=0.3, min_samples=3,
                       of_steps=True)
  deadlines = watchdog.Deadlines(progress, 30, rules={'training': rule})
  fired = []
  dog = watchdog.Watchdog(30, progress.waiting_since, fired.append,
                          poll=0.02, deadline=deadlines.now).start()
  with progress.waiting('training'):
    _beats(progress, 0.02, 9)
    progress.beat()  # The last answer.
    frozen = time.monotonic()
    while not fired and time.monotonic() - frozen < 10:
      time.sleep(0.01)
  dog.stop()
  assert fired and 0.3 <= time.monotonic() - frozen < 2
  assert 0.3 <= fired[0] < 2


def test_the_stuck_line_says_its_deadline_and_the_launcher_reads_it(
    caplog, monkeypatch):
  progress = distribution.Progress()
  deadlines = watchdog.Deadlines(progress, ceiling=120)
  said = []
  end = watchdog.end_stuck_worker(1, deadlines, [lambda: said.append(1),
                                                 lambda: 1 / 0])
  monkeypatch.setattr(watchdog.os, '_exit', sys.exit)
  with progress.waiting('export'), pytest.raises(SystemExit):
    end(121.4)
  assert said == [1]  # Its last words came first; a failing one no matter.
  line = caplog.records[-1].getMessage()
  assert '(the export deadline, 10 x --failure_timeout)' in line
  assert failures.describe_failure(4, [line], ['h1', 'h2'], 1).cause == (
      "worker 0 was frozen or stuck: the others waited 121 s on the job's "
      'collectives, then ended themselves')


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
           'from resnet_keras.training import watchdog\n'
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
