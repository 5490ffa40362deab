"""testbed/soak/plan.py: the jobs a seed draws, the fault catalogue's
reach and the bound on a job's end."""

import pytest

from testbed.soak import plan as soak_plan
from tests.support import soak_records


def test_the_same_seed_draws_the_same_plan_and_another_seed_another():
  draw = lambda seed: soak_plan.draw_plan(seed, 12, soak_plan.PLACEMENTS,
                                          soak_plan.BACKENDS)
  assert draw(5) == draw(5)
  assert draw(5) != draw(6)


def test_a_few_jobs_cover_every_placement_and_backend():
  plans = soak_plan.draw_plan(1, 6, soak_plan.PLACEMENTS,
                              soak_plan.BACKENDS)
  assert {(p.placement, p.backend) for p in plans} == {
      (p, b) for p in soak_plan.PLACEMENTS for b in soak_plan.BACKENDS}


def test_every_drawn_fault_applies_to_its_placement_and_moment():
  plans = soak_plan.draw_plan(2, 300, soak_plan.PLACEMENTS,
                              soak_plan.BACKENDS)
  for plan in plans:
    fault = soak_plan.FAULTS[plan.fault]
    assert plan.placement in fault.placements and plan.moment in fault.moments
    assert 1 <= plan.victim < soak_plan.WORKERS
    assert 0 <= plan.delay <= soak_plan.MAX_DELAY[plan.moment]
    # Recovery: a first fault to recover from, then the drawn one.
    if plan.moment == 'recovery':
      assert plan.faults[0] == soak_plan.FIRST_FAULT and len(plan.faults) == 2
    else:
      assert len(plan.faults) == 1
  assert {p.moment for p in plans} == set(soak_plan.MOMENTS)
  assert {p.fault for p in plans} == set(soak_plan.FAULTS)


@pytest.mark.parametrize('placement,absent', [
    ('this_host', {'cut_link', 'flap_link', 'slurm_usr1', 'slurm_requeue',
                   'slurm_cancel_step', 'slurm_node_down'}),
    ('ssh', {'slurm_usr1', 'slurm_requeue', 'slurm_cancel_step',
             'slurm_node_down'}),
    ('slurm', {'kill_launcher', 'term_launcher'}),
])
def test_the_catalogue_applies_each_fault_where_it_can_happen(placement,
                                                              absent):
  names = {fault.name for fault in soak_plan.applicable(placement)}
  assert names == set(soak_plan.FAULTS) - absent
  assert soak_plan.FAULTS['disk_full'].moments == ('checkpoint', 'export')


def test_the_bound_grows_with_the_restarts_and_requeues_a_job_may_make():
  one = soak_records.plan()
  assert soak_plan.bound_seconds(one, 60) == 120 + 2 * 60
  two = soak_records.plan(faults=(soak_plan.FIRST_FAULT,
                                  ('slurm_requeue', 'recovery')))
  assert soak_plan.bound_seconds(two, 60) == 120 + (3 + 1) * 60



def test_every_fault_has_a_recovery_bound_and_a_hang_the_longest():
  assert set(soak_plan.DETECT_SECONDS) == set(soak_plan.FAULTS)
  assert soak_plan.recovery_bound('kill_rank') == 12 + 90
  # A frozen peer is named only at the stuck-worker deadline.
  assert soak_plan.recovery_bound('freeze_rank') == 11 * 12 + 90
