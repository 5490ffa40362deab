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


@pytest.mark.parametrize('pace,seconds,fails', [
    (budget.REFERENCE_PACE, budget.BUDGET_SECONDS - 60, False),
    (budget.REFERENCE_PACE, budget.BUDGET_SECONDS + 60, True),
    # On a machine twice as slow the same run is within its budget.
    (2 * budget.REFERENCE_PACE, budget.BUDGET_SECONDS + 60, False)])
def test_a_run_past_its_budget_fails(pace, seconds, fails):
  session = _session(pace, seconds)
  budget.pytest_sessionfinish(session)
  assert (session.exitstatus == pytest.ExitCode.TESTS_FAILED) is fails


def test_limits_stretch_on_slower_machines_only():
  config = types.SimpleNamespace()
  deadlines.set_scale(config, 2.5)
  assert deadlines.scale(config) == 2.5
  deadlines.set_scale(config, 0.4)
  assert deadlines.scale(config) == 1.0
