"""The full suite's budget (tests/support/budget.py): scaled by the pace,
and a run past it fails."""

import types

import pytest

from tests.support import budget
from tests.support import deadlines


def test_the_budget_scales_with_the_pace():
  assert budget.budget(budget.REFERENCE_PACE) == budget.BUDGET_SECONDS
  assert budget.budget(2 * budget.REFERENCE_PACE) == pytest.approx(
      2 * budget.BUDGET_SECONDS)


def _session(pace, seconds_ago):
  config = types.SimpleNamespace(stash=pytest.Stash())
  config.stash[budget._PACE] = pace  # pylint: disable=protected-access
  config.stash[budget._STARTED] = (  # pylint: disable=protected-access
      budget.time.time() - seconds_ago)
  return types.SimpleNamespace(config=config, exitstatus=pytest.ExitCode.OK)


REF = budget.REFERENCE_PACE
SECONDS = budget.BUDGET_SECONDS


@pytest.mark.parametrize('start,end,seconds,fails', [
    (REF, REF, SECONDS - 60, False),
    (REF, REF, SECONDS + 60, True),
    # On a machine twice as slow the same run is within its budget.
    (2 * REF, 2 * REF, SECONDS + 60, False),
    # Slow at the start only (a passing burst of load): past the budget at
    # the slower reading still fails...
    (2 * REF, REF, 2 * SECONDS + 60, True),
    # ...and between the two budgets the run is not failed on time.
    (2 * REF, REF, 1.5 * SECONDS, False)])
def test_a_run_past_its_budget_fails(monkeypatch, start, end, seconds, fails):
  monkeypatch.setattr(budget.pace, 'measure', lambda: end)
  session = _session(start, seconds)
  budget.pytest_sessionfinish(session)
  assert (session.exitstatus == pytest.ExitCode.TESTS_FAILED) is fails


@pytest.mark.parametrize('took,start,end,expected', [
    # Budgets at 1x and 1.5x the reference pace: 2100 s and 3150 s.
    (2000, REF, 1.5 * REF, 'within'),
    (2000, 1.5 * REF, REF, 'within'),
    (2100, REF, 1.5 * REF, 'within'),
    (2500, REF, 1.5 * REF, 'unclear'),
    (2500, 1.5 * REF, REF, 'unclear'),
    (3150, 1.5 * REF, REF, 'unclear'),
    (3200, REF, 1.5 * REF, 'over'),
    # A steady machine leaves no room between the two.
    (2101, REF, REF, 'over')])
def test_the_verdict_is_judged_at_both_readings(took, start, end, expected):
  assert budget.verdict(took, start, end) == expected


def test_limits_stretch_on_slower_machines_only():
  config = types.SimpleNamespace()
  deadlines.set_scale(config, 2.5)
  assert deadlines.scale(config) == 2.5
  deadlines.set_scale(config, 0.4)
  assert deadlines.scale(config) == 1.0
