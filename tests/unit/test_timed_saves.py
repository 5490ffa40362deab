"""Checkpoints by time (timed_saves.py): the interval against hand-computed
values, and the action's saves on a clock of the test's."""

import math

import pytest

from resnet_keras.training import timed_saves


def test_young_daly_balances_the_saves_stall_against_the_redone_work():
  assert timed_saves.young_daly(0.2, 120) == pytest.approx(math.sqrt(48))
  assert timed_saves.young_daly(2.0, 3600) == pytest.approx(120.0)


@pytest.mark.parametrize('stalls, write, mtbf, seconds', [
    ([0.2], 0.0, 120.0, 10.0),  # sqrt(48) = 6.9: the floor.
    ([0.2, 0.1, 0.3], 0.0, 3600.0, math.sqrt(1440)),  # The median stall.
    ([], 0.0, 3600.0, math.sqrt(7200)),  # Before a save: PRIOR_STALL.
    ([0.5], 40.0, 3600.0, 60.0),  # 1.5 x the write's 40 s.
    ([100.0], 0.0, 360000.0, 1800.0),  # The ceiling.
])
def test_the_default_interval(stalls, write, mtbf, seconds):
  assert timed_saves.auto_interval(stalls, write, mtbf) == pytest.approx(
      seconds)


def test_the_mean_time_between_failures_is_the_jobs_time_over_its_attempts():
  assert timed_saves.mean_time_between_failures([], 5000.0) == 3600.0
  # Two attempts before this one, the first at 1000: 300 s over 2.
  assert timed_saves.mean_time_between_failures([1000.0, 1100.0],
                                                1300.0) == 150.0


class _Saver:
  """checkpoints.Saver's face to the action: its saves recorded."""

  def __init__(self):
    self.saved_at, self.last_write_seconds, self.saves = None, 0.0, []

  def save(self, step, attempt, why):
    del attempt
    self.saves.append((step, why))
    self.saved_at = clock[0]
    return 0.2


clock = [0.0]


def test_a_save_at_the_first_loop_end_past_the_interval_and_none_before():
  clock[0] = 100.0
  saver = _Saver()
  action = timed_saves.TimedSaves(30.0, 3600.0, saver, lambda: 12, None,
                                  agree=None, clock=lambda: clock[0])
  action({})  # The first loop's end (it traced): the interval starts here.
  clock[0] = 129.9
  action({})
  assert saver.saves == []
  clock[0] = 130.0
  action({})
  assert saver.saves == [(12, ' (by time)')]
  clock[0] = 150.0  # 20 s after that save.
  action({})
  assert len(saver.saves) == 1


def test_every_worker_saves_when_any_worker_is_due():
  clock[0] = 0.0
  saver = _Saver()
  asked = []

  def agree(due):
    asked.append(due)
    return True  # Another worker's clock says so.

  action = timed_saves.TimedSaves(0.0, 120.0, saver, lambda: 4, None, agree,
                                  clock=lambda: clock[0])
  action({})
  assert asked == [False] and saver.saves == [(4, ' (by time)')]
  # The auto interval after a save that stalled 0.2 s, failures every 120 s.
  assert action.interval() == 10.0
