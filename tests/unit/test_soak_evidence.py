"""testbed/soak/evidence.py: the soak's readers of a job's log and of its
checkpoints."""

import json
import signal
import subprocess

import pytest

from testbed.soak import evidence as soak_evidence
from testbed.soak import invariants as soak_invariants
from testbed.soak import jobs as soak_jobs
from testbed.soak.invariants import Restart
from tests.support import soak_records


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
  assert soak_evidence.weights_drift(shrunk, reference) == pytest.approx(0.1)
  assert soak_evidence.weights_drift(reference, reference) == 0
  # Nothing to compare: no checkpoint, or a reference with one.
  assert soak_evidence.weights_drift(str(tmp_path / 'none'), reference) is None
  assert soak_evidence.weights_drift(reference, shrunk) is None


def test_the_log_readers():
  lines = ['12:00:01 I step 2/24 | loss', '12:00:02 I step 6/24 | loss',
           'job failed after 9 s (exit 137): rank 1 ...; restarting',
           'restart 1 of 2: rank 1', '12:00:09 I restored from /m/ckpt-4 at '
           'step 4', '12:00:10 I step 6/24 | loss',
           '12:00:20 I port guard: could not remove']
  assert soak_evidence.resumes_in(lines) == [(6, 4)]
  assert soak_evidence.last_line(lines) == '12:00:10 I step 6/24 | loss'
  assert soak_evidence.is_named(lines[2])
  assert not soak_evidence.is_named(lines[1])
  assert soak_evidence.world_changes([
      'E elastic: the job shrinks from 3 to 2 host(s) (a, b): ...; from step '
      '0 (no checkpoint yet); 53 s lost',
      'E elastic: the job grows from 2 to 3 host(s) (a, b, c): ...; resuming '
      'at step 12; 9 s lost']) == [0, 12]


@pytest.mark.parametrize('summary,outcome', [
    (None, 'wrong end'), ({'train_steps': 20}, 'wrong end'),
    ({'train_steps': 24}, 'completed')])
def test_a_job_that_exited_0_short_of_its_steps_ended_wrong(
    tmp_path, summary, outcome):
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  if summary is not None:
    (model_dir / 'run_summary.json').write_text(json.dumps(summary))
  record = soak_records.record(summary_steps=None)
  soak_evidence.read_results(record, soak_jobs.Log(str(tmp_path / 'log')),
                             str(model_dir), last_fault=0.0)
  assert record.outcome == outcome
  assert bool(soak_invariants.check_ended(record)) == (outcome != 'completed')


@pytest.mark.parametrize('code,summary,problem', [
    (None, {}, 'no end'), (1, {}, 'exit 1'),
    (0, {}, 'exited 0 without a run_summary.json'),
    (0, {'train_steps': 20, 'weights_sha256': 'w'},
     'exited 0 at step 20, not its planned 24'),
    (0, {'train_steps': 24}, 'run_summary.json records no weights_sha256'),
    (0, {'train_steps': 24, 'weights_sha256': 'w'}, '')])
def test_an_uninterrupted_run_that_gives_no_weights_says_why(code, summary,
                                                             problem):
  assert soak_evidence.reference_problem(code, summary, 24) == problem


def test_a_process_state_as_the_kernel_shows_it():
  process = subprocess.Popen(['sleep', '60'])
  try:
    assert soak_evidence.wait_for(
        lambda: soak_evidence.process_state(process.pid),
        lambda state: state == 'S', 2) == 'S'
    process.send_signal(signal.SIGSTOP)
    assert soak_evidence.wait_for(
        lambda: soak_evidence.process_state(process.pid),
        lambda state: state == 'T', 2) == 'T'
    process.kill()
    assert soak_evidence.wait_for(
        lambda: soak_evidence.process_state(process.pid),
        lambda state: state == 'Z', 2) == 'Z'
  finally:
    process.kill()
    process.wait()
  assert soak_evidence.process_state(process.pid) == ''


def test_wait_for_gives_up_with_what_it_saw_last():
  seen = iter(range(100))
  assert soak_evidence.wait_for(lambda: next(seen), lambda n: n < 0,
                                0.1) > 0


def test_the_lines_after_a_moment():
  log = soak_jobs.Log('unused')
  log.lines, log.seen = ['a', 'b', 'c', 'd'], [1.0, 2.0, 2.0, 3.0]
  assert soak_evidence.lines_after(log, 2.0) == ['b', 'c', 'd']
  assert soak_evidence.lines_after(log, 2.5) == ['d']
  assert soak_evidence.lines_after(log, 4.0) == []


def test_each_restarts_attempt_in_the_log():
  lines = [
      '12:00:01 I step 4/24 | loss', '12:00:01 I saved checkpoint /m/ckpt-4',
      'job failed after 9 s (exit 137): rank 1 ...; restarting',
      'restart 1 of 3: rank 1 on host h2 was killed by SIGKILL (9)',
      # Killed again before its restore: a second restart.
      'restart 2 of 3: rank 1 ...',
      '12:00:09 I restored from /m/ckpt-4 at step 4',
      '12:00:10 I step 6/24 | loss', '12:00:11 I saved checkpoint /m/ckpt-8',
      '12:00:12 I saved checkpoint at step 9 after signal (/m/ckpt-9)',
      'E requeued 1 time(s) by the scheduler: resuming at step 9',
      '12:00:40 I step 10/24 | loss',
      # A line of the attempt after it trained is not its restore.
      '12:00:41 I restored from /m/ckpt-4 at step 4']
  assert soak_evidence.restarts_in(lines) == [
      Restart((4,), None, False), Restart((4,), 4, True),
      Restart((4, 8, 9), None, True)]
  # An attempt that resumed at the last step evaluates without a step.
  assert soak_evidence.restarts_in([
      'restart 1 of 2: ...', 'I restored from /m/ckpt-24 at step 24',
      'I eval at step 24 (epoch 1.00): accuracy 0.1']) == [
          Restart((), 24, True)]


def test_a_recovery_runs_to_the_first_step_after_the_restart():
  log = soak_jobs.Log('unused')
  log.lines = ['12:00:01 I step 8/24 | loss',
               # Logged before the kill, seen after it: not a recovery.
               '12:00:02 I step 10/24 | loss',
               'job failed after 9 s (exit 137): rank 1 ...',
               'restart 1 of 2: rank 1 ...',
               '12:00:30 I restored from /m/ckpt-8 at step 8',
               '12:00:35 I step 10/24 | loss']
  log.seen = [9.5, 10.5, 20.0, 20.0, 40.0, 45.0]
  assert soak_evidence.recovery_seconds(log, 10.0) == 35.0
  # No restart: the job went on by itself (a pause).
  log.lines, log.seen = log.lines[:2], log.seen[:2]
  assert soak_evidence.recovery_seconds(log, 10.0) == 0.5
  assert soak_evidence.recovery_seconds(log, 11.0) is None
