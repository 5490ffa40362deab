"""testbed/soak.py's own logic, in-process: the plan a seed draws, the fault
catalogue's reach, and each invariant on hand-made job records."""

import dataclasses
import os
import re

import pytest

from testbed import soak


def _plan(**changes):
  plan = soak.JobPlan(index=0, placement='ssh', backend='horovod',
                      faults=(('kill_rank', 'mid_step'),), delay=0.5,
                      victim=1, steps=24)
  return dataclasses.replace(plan, **changes)


def _record(**changes):
  fields = dict(plan=_plan(), outcome='completed', bound=300,
                resumes=[(10, 8)], readable_before=[4, 8],
                readable_after=[4, 8, 12, 16, 20, 24],
                files_before={'ckpt-4.index': 'a', 'ckpt-8.index': 'b'},
                files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                             'ckpt-12.index': 'c'},
                weights='w', reference_weights='w', restarts_logged=1,
                summary_restarts=1, summary_world_sizes=1)
  fields.update(changes)
  return soak.JobRecord(**fields)


def test_the_same_seed_draws_the_same_plan_and_another_seed_another():
  draw = lambda seed: soak.draw_plan(seed, 12, soak.PLACEMENTS, soak.BACKENDS)
  assert draw(5) == draw(5)
  assert draw(5) != draw(6)


def test_a_few_jobs_cover_every_placement_and_backend():
  plans = soak.draw_plan(1, 6, soak.PLACEMENTS, soak.BACKENDS)
  assert {(p.placement, p.backend) for p in plans} == {
      (p, b) for p in soak.PLACEMENTS for b in soak.BACKENDS}


def test_every_drawn_fault_applies_to_its_placement_and_moment():
  plans = soak.draw_plan(2, 300, soak.PLACEMENTS, soak.BACKENDS)
  for plan in plans:
    fault = soak.FAULTS[plan.fault]
    assert plan.placement in fault.placements and plan.moment in fault.moments
    assert 1 <= plan.victim < soak.WORKERS
    assert 0 <= plan.delay <= soak.MAX_DELAY[plan.moment]
    # Recovery: a first fault to recover from, then the drawn one.
    if plan.moment == 'recovery':
      assert plan.faults[0] == soak.FIRST_FAULT and len(plan.faults) == 2
    else:
      assert len(plan.faults) == 1
  assert {p.moment for p in plans} == set(soak.MOMENTS)
  assert {p.fault for p in plans} == set(soak.FAULTS)


@pytest.mark.parametrize('placement,absent', [
    ('this_host', {'cut_link', 'flap_link', 'slurm_usr1', 'slurm_requeue',
                   'slurm_cancel_step', 'slurm_node_down'}),
    ('ssh', {'slurm_usr1', 'slurm_requeue', 'slurm_cancel_step',
             'slurm_node_down'}),
    ('slurm', {'kill_launcher', 'term_launcher'}),
])
def test_the_catalogue_applies_each_fault_where_it_can_happen(placement,
                                                              absent):
  names = {fault.name for fault in soak.applicable(placement)}
  assert names == set(soak.FAULTS) - absent
  assert soak.FAULTS['disk_full'].moments == ('checkpoint', 'export')


def test_the_bound_grows_with_the_restarts_and_requeues_a_job_may_make():
  one = _plan()
  assert soak.bound_seconds(one, 60) == 120 + 2 * 60
  two = _plan(faults=(soak.FIRST_FAULT, ('slurm_requeue', 'recovery')))
  assert soak.bound_seconds(two, 60) == 120 + (3 + 1) * 60


def test_a_clean_record_breaks_no_invariant():
  assert soak.broken_invariants(_record()) == []


@pytest.mark.parametrize('changes,broken', [
    (dict(outcome='HANG'), 'ends: no end within 300 s'),
    (dict(outcome='unnamed', last_line='Killed'),
     "ends: ended without a line naming the fault: 'Killed'"),
    (dict(left_processes={'h2': ['orted']}), 'no processes: left on h2: orted'),
    (dict(resumes=[(15, 8)]), 'resume: redid 7 steps (8 after 15), more '
     'than 4'),
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
    (dict(summary_restarts=0), 'attempts: run_summary.json has 0 restarts, '
     'the log 1'),
    (dict(summary_world_sizes=2), 'attempts: run_summary.json has 2 world '
     'sizes, the log 1'),
    (dict(requeues_logged=1, summary_requeues=0), 'attempts: '
     'run_summary.json has 0 requeues, the log 1'),
])
def test_each_invariant_fails_on_a_record_that_breaks_it(changes, broken):
  found = soak.broken_invariants(_record(**changes))
  assert len(found) == 1 and found[0].startswith(broken), found


def test_what_the_invariants_allow():
  # A truncated newest checkpoint: two intervals redone, from the one
  # before it; the truncated files changed by the soak itself.
  truncated = _record(
      plan=_plan(faults=(('truncate_newest', 'mid_step'),)),
      resumes=[(11, 4)], truncated=['ckpt-8.index'],
      files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'rewritten'})
  assert soak.broken_invariants(truncated) == []
  # A checkpoint after the resumed step is written again by the resume.
  assert soak.broken_invariants(_record(
      files_before={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                    'ckpt-12.index': 'c'},
      readable_before=[4, 8], resumes=[(12, 8)],
      files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                   'ckpt-12.index': 'again'})) == []
  # A shrunk job's weights are not the uninterrupted run's; a job that
  # ended on a named line wrote no summary to compare.
  assert soak.broken_invariants(_record(shrank=True, weights='v',
                                        world_changes=[12], drift=0.05,
                                        summary_world_sizes=2)) == []
  # A shrink before the first checkpoint replaces the first shape.
  assert soak.broken_invariants(_record(shrank=True, world_changes=[0],
                                        summary_world_sizes=1)) == []
  assert soak.broken_invariants(_record(outcome='named', weights=None,
                                        summary_restarts=None)) == []


def _run_dir(path, steps_and_values):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  module = tf.Module()
  module.kernel = tf.Variable([0.0, 0.0])
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=module), str(path), max_to_keep=None)
  for step, value in steps_and_values:
    module.kernel.assign(value)
    manager.save(checkpoint_number=step)
  return str(path)


def test_the_drift_of_a_shrunk_job_is_measured_against_the_reference_travel(
    tmp_path):
  # The reference moves from (0, 0) at its first checkpoint to (3, 4): 5.
  reference = _run_dir(tmp_path / 'ref', [(4, [0.0, 0.0]), (24, [3.0, 4.0])])
  shrunk = _run_dir(tmp_path / 'job', [(24, [3.0, 4.5])])
  assert soak.weights_drift(shrunk, reference) == pytest.approx(0.1)
  assert soak.weights_drift(reference, reference) == 0
  # Nothing to compare: no checkpoint, or a reference with one.
  assert soak.weights_drift(str(tmp_path / 'none'), reference) is None
  assert soak.weights_drift(reference, shrunk) is None


def test_the_log_readers():
  lines = ['12:00:01 I step 2/24 | loss', '12:00:02 I step 6/24 | loss',
           'job failed after 9 s (exit 137): rank 1 ...; restarting',
           'restart 1 of 2: rank 1', '12:00:09 I restored from /m/ckpt-4 at '
           'step 4', '12:00:10 I step 6/24 | loss',
           '12:00:20 I port guard: could not remove']
  assert soak.resumes_in(lines) == [(6, 4)]
  assert soak.last_line(lines) == '12:00:10 I step 6/24 | loss'
  assert soak.is_named(lines[2]) and not soak.is_named(lines[1])
  assert soak.world_changes([
      'E elastic: the job shrinks from 3 to 2 host(s) (a, b): ...; from step '
      '0 (no checkpoint yet); 53 s lost',
      'E elastic: the job grows from 2 to 3 host(s) (a, b, c): ...; resuming '
      'at step 12; 9 s lost']) == [0, 12]


def test_the_world_sizes_a_run_keeps():
  assert soak.expected_world_sizes([]) == 1
  assert soak.expected_world_sizes([0]) == 1
  assert soak.expected_world_sizes([12, 20]) == 3
  assert soak.expected_world_sizes([12, 12]) == 2


def test_a_row_names_the_broken_invariant_and_the_table_counts_it():
  hang = _record(outcome='HANG', seconds_to_named=None)
  assert soak.row(hang).rstrip().endswith('ends: no end within 300 s of the '
                                          'last fault')
  table = soak.summary_table([_record(), hang])
  assert len(table) == 2
  assert table[1].split()[:8] == ['ssh', 'horovod', 'kill_rank', '2', '1',
                                  '0', '1', '0']


def test_bad_arguments_end_in_one_line(capsys):
  with pytest.raises(SystemExit) as ended:
    soak.main(['--seed', '1', '--backends', 'mpi'])
  assert ended.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: --backends 'mpi': choose from horovod,"
                 'multi_worker_mirrored']


def test_docs_testing_md_lists_the_catalogue():
  with open(os.path.join(soak.REPO_ROOT, 'docs', 'testing.md')) as f:
    rows = re.findall(r'^\| `(\w+)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$',
                      f.read(), re.MULTILINE)
  assert [name for name, _, _ in rows] == [f.name for f in soak.CATALOGUE]
  for name, _, placements in rows:
    fault = soak.FAULTS[name]
    listed = placements.strip()
    assert (listed == 'all') == (fault.placements == soak.PLACEMENTS), name
    if listed != 'all':
      assert listed.replace('this_host', 'this host').split(', ') == [
          p.replace('this_host', 'this host') for p in fault.placements], name
