"""testbed/soak/invariants.py: each invariant on hand-made job records,
passing and failing."""

import pytest

from testbed.soak import invariants as soak_invariants
from testbed.soak.invariants import Restart
from tests.support import soak_records


def test_a_clean_record_breaks_no_invariant():
  assert soak_invariants.broken_invariants(soak_records.record()) == []


@pytest.mark.parametrize('changes,broken', [
    (dict(outcome='HANG'), 'ends: no end within 300 s'),
    (dict(outcome='unnamed', last_line='Killed'),
     "ends: ended without a line naming the fault: 'Killed'"),
    (dict(outcome='wrong end', summary_steps=None),
     'ends: exited 0 without a run_summary.json'),
    (dict(outcome='wrong end', summary_steps=20),
     'ends: exited 0 at step 20, not its planned 24'),
    # The label is not trusted: a completed job's own summary is read.
    (dict(summary_steps=16), 'ends: exited 0 at step 16, not its planned 24'),
    (dict(outcome='missed'), 'ends: ended before its kill_rank at mid_step '
     'struck'),
    (dict(outcome='crashed'), "ends: outcome 'crashed'"),
    (dict(left_processes={'h2': ['orted']}), 'no processes: left on h2: orted'),
    (dict(resumes=[(17, 8)]), 'resume: redid 9 steps (8 after 17), more '
     'than 8'),
    (dict(resumes=[(8, 4)]), 'resume: resumed at step 4, older than the '
     'newest readable checkpoint ckpt-8'),
    (dict(readable_after=[4, 12]), 'data: readable checkpoints lost: ckpt-8'),
    (dict(readable_after=[]), 'data: readable checkpoints lost: ckpt-4, '
     'ckpt-8'),
    (dict(files_after={'ckpt-8.index': 'b'}), 'data: ckpt-4.index lost'),
    (dict(files_after={'ckpt-4.index': 'x', 'ckpt-8.index': 'b'}),
     'data: ckpt-4.index changed'),
    (dict(weights='v'), 'weights: weights differ from the uninterrupted run'),
    (dict(shrank=True, weights='v', world_changes=[12], summary_world_sizes=2,
          drift=0.4), 'weights: a shrunk job ended 0.400 of the '
     'uninterrupted run'),
    (dict(shrank=True, world_changes=[12], summary_world_sizes=2,
          drift=None), "weights: a shrunk job's drift from the uninterrupted "
     'run was not measured'),
    (dict(weights=None), 'weights: run_summary.json records no '
     'weights_sha256'),
    (dict(reference_weights=None), 'weights: the uninterrupted run recorded '
     'no weights_sha256'),
    # A failed reference fails every job of its layout, ended well or not.
    (dict(reference_weights=None, reference_error='exit 1'), 'weights: the '
     'uninterrupted run of the layout failed (exit 1): nothing to compare'),
    (dict(outcome='named', reference_weights=None, reference_error='no end'),
     'weights: the uninterrupted run of the layout failed (no end)'),
    (dict(summary_restarts=0), 'attempts: run_summary.json has 0 restarts, '
     'the log 1'),
    (dict(summary_world_sizes=2), 'attempts: run_summary.json has 2 world '
     'sizes, the log 1'),
    (dict(requeues_logged=1, summary_requeues=0), 'attempts: '
     'run_summary.json has 0 requeues, the log 1'),
])
def test_each_invariant_fails_on_a_record_that_breaks_it(changes, broken):
  found = soak_invariants.broken_invariants(soak_records.record(**changes))
  assert len(found) == 1 and found[0].startswith(broken), found


def test_what_the_invariants_allow():
  # A truncated newest checkpoint: three intervals redone, from the one
  # before it; the truncated files changed by the soak itself.
  truncated = soak_records.record(
      plan=soak_records.plan(faults=(('truncate_newest', 'mid_step'),)),
      resumes=[(16, 4)], truncated=['ckpt-8.index'],
      faults=[soak_records.fault('truncate_newest')],
      files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'rewritten'})
  assert soak_invariants.broken_invariants(truncated) == []
  # A checkpoint after the resumed step is written again by the resume.
  assert soak_invariants.broken_invariants(soak_records.record(
      files_before={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                    'ckpt-12.index': 'c'},
      readable_before=[4, 8], resumes=[(12, 8)],
      files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                   'ckpt-12.index': 'again'})) == []
  # A shrunk job's weights are not the uninterrupted run's; a job that
  # ended on a named line wrote no summary to compare.
  broken = lambda **changes: soak_invariants.broken_invariants(
      soak_records.record(**changes))
  assert broken(shrank=True, weights='v', world_changes=[12], drift=0.05,
                summary_world_sizes=2) == []
  # A shrink before the first checkpoint replaces the first shape.
  assert broken(shrank=True, world_changes=[0], summary_world_sizes=1,
                drift=0.05) == []
  assert broken(outcome='named', weights=None, summary_restarts=None) == []
  # Told not to run the uninterrupted runs (--no_reference): nothing to
  # compare, and nothing said against the job.
  assert broken(weights_compared=False, reference_weights=None) == []


def test_the_world_sizes_a_run_keeps():
  assert soak_invariants.expected_world_sizes([]) == 1
  assert soak_invariants.expected_world_sizes([0]) == 1
  assert soak_invariants.expected_world_sizes([12, 20]) == 3
  assert soak_invariants.expected_world_sizes([12, 12]) == 2


RECOVERY = soak_records.plan(faults=(('kill_rank', 'mid_step'),
                                     ('freeze_rank', 'recovery')))


@pytest.mark.parametrize('changes,broken', [
    (dict(faults=[]), ['faults landed: 0 of 1 faults landed']),
    # The soak's call went out, the world did not change: no landing.
    (dict(faults=[soak_records.fault(landed=False, did='pid 7',
                                     evidence='pid 7 still in state S')]),
     ['faults landed: 0 of 1 faults landed',
      'faults landed: kill_rank at mid_step: pid 7 still in state S']),
    # Awaiting the job's own line, which never came.
    (dict(faults=[soak_records.fault('term_launcher', landed=None,
                                     did='pid 9', evidence='')]),
     ['faults landed: 0 of 1 faults landed',
      'faults landed: term_launcher at mid_step: not shown (pid 9)']),
    # Ended before the second fault's moment: 'missed', one of two dealt.
    (dict(plan=RECOVERY, outcome='missed'),
     ['ends: ended before its freeze_rank at recovery struck',
      'faults landed: 1 of 2 faults landed']),
    (dict(plan=RECOVERY, outcome='missed', faults=[]),
     ['ends: ended before its kill_rank at mid_step struck',
      'faults landed: 0 of 2 faults landed']),
])
def test_a_fault_that_did_not_land_breaks_an_invariant(changes, broken):
  assert soak_invariants.broken_invariants(
      soak_records.record(**changes)) == broken


def test_every_fault_of_the_plan_landed():
  assert soak_invariants.check_faults_landed(soak_records.record(
      plan=RECOVERY, faults=[soak_records.fault(),
                             soak_records.fault('freeze_rank', 'recovery')])
  ) == []


@pytest.mark.parametrize('restarts,truncated,broken', [
    # Trained again from step 0 though ckpt-8 had been saved: the redo
    # bound alone passes it (no resume to read).
    ([Restart((4, 8), None, True)], [], ['restarts resume: 1 restart(s) '
     'trained again after a checkpoint was saved, 0 resumed from one '
     '(restart 1 started over)']),
    ([Restart((4, 8), 8, True), Restart((4, 8, 12), None, True)], [],
     ['restarts resume: 2 restart(s) trained again after a checkpoint was '
      'saved, 1 resumed from one (restart 2 started over)']),
    # The soak cut only ckpt-8; ckpt-4 still read.
    ([Restart((4, 8), None, True)], ['ckpt-8.index'], ['restarts resume: 1 '
     'restart(s) trained again after a checkpoint was saved, 0 resumed from '
     'one (restart 1 started over)']),
    # What may start over: nothing saved yet, or only what the soak cut; a
    # restart ended (by the next fault) before it trained.
    ([Restart((), None, True)], [], []),
    ([Restart((4,), None, True)],
     ['ckpt-4.index', 'ckpt-4.data-00000-of-00001'], []),
    ([Restart((4, 8), None, False), Restart((4, 8), 8, True)], [], []),
])
def test_every_restart_that_trained_again_resumed(restarts, truncated,
                                                  broken):
  record = soak_records.record(restarts=restarts, truncated=truncated)
  assert soak_invariants.check_restarts_resume(record) == [
      b.split(': ', 1)[1] for b in broken]
  assert [b for b in soak_invariants.broken_invariants(record)
          if b.startswith('restarts resume')] == broken


@pytest.mark.parametrize('faults,broken', [
    ([soak_records.fault(recovery=103.0)],
     ['recovery: kill_rank at mid_step: 103 s to the next step, more than '
      '102 s']),
    ([soak_records.fault(recovery=101.0)], []),
    ([soak_records.fault(recovery=None)], []),
    # A restart hit again by the drawn fault: the first recovery's bound
    # holds both; the second's only its own.
    ([soak_records.fault(at=30.0, recovery=300.0),
      soak_records.fault('freeze_rank', 'recovery', at=60.0,
                         recovery=230.0)],
     ['recovery: freeze_rank at recovery: 230 s to the next step, more '
      'than 222 s']),
    ([soak_records.fault(at=30.0, recovery=300.0),
      soak_records.fault('freeze_rank', 'recovery', at=60.0,
                         recovery=200.0)], []),
    # ... but not a fault that struck after it had recovered.
    ([soak_records.fault(at=30.0, recovery=150.0),
      soak_records.fault('freeze_rank', 'recovery', at=200.0,
                         recovery=100.0)],
     ['recovery: kill_rank at mid_step: 150 s to the next step, more than '
      '102 s']),
])
def test_every_recovery_within_its_bound(faults, broken):
  plan = soak_records.plan(faults=tuple((f.name, f.moment) for f in faults))
  assert [b for b in soak_invariants.broken_invariants(soak_records.record(
      plan=plan, faults=faults)) if b.startswith('recovery')] == broken


def test_a_fault_that_did_not_land_has_no_recovery_to_bound():
  record = soak_records.record(faults=[soak_records.fault(
      landed=False, evidence='no rank running', recovery=500.0)])
  assert soak_invariants.check_recoveries(record) == []
  assert soak_invariants.check_faults_landed(record)
