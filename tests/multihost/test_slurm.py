"""The launcher under a real Slurm (testbed/slurm.py: Debian's slurmctld
and slurmd on the namespace cluster's three hosts), as a Slurm user runs
it: batch jobs on every node under each backend, the batch script the
launcher prints, Slurm's warning signal (save, requeue, exact resume) and
a node lost mid-run (named in bounded time; with --no-kill the job goes on
on the nodes left), and the fault soak's jobs under Slurm. One xdist group: the tests share the cluster and the
uninterrupted run the requeued one is compared with. They need root and
skip without it, saying so."""

import importlib
import re
import shlex
import sys
import time

import pytest

from testbed import cluster as cluster_lib
from testbed import slurm as slurm_lib
from testbed.soak import report
from testbed.soak import runner as soak
from testbed.soak import invariants as soak_invariants
from testbed.soak import plan as soak_plan
from tests.support import deadlines
from tests.support import launcher
from tests.support import runner


def _why_not():
  """Why this machine cannot run the Slurm cluster, or None."""
  missing = cluster_lib.missing_requirements()
  if missing is None and slurm_lib.missing_tools():
    missing = (f'no {", ".join(slurm_lib.missing_tools())} (scripts/test.sh '
               'installs slurmctld, slurmd, slurm-client and munge)')
  return missing


_missing = _why_not()
pytestmark = [pytest.mark.skipif(_missing is not None,
                                 reason=f'no Slurm cluster: {_missing}'),
              pytest.mark.xdist_group('slurm')]
# The cluster of this module (conftest.py): its hosts, and the subnets
# 10.77.N.0/24 it may take (the other modules' are apart).
CLUSTER_HOSTS = 3
CLUSTER_SUBNETS = range(1, 20)

STEPS = 16
# Horovod: 3 workers x 4; multi_worker_mirrored: --batch_size is global.
HOROVOD = ['--use_horovod', '--batch_size=4']
MIRRORED = ['-ds', 'multi_worker_mirrored', '--batch_size=12']
# A job script's usual flags; --clean applies to the job's first start only.
SEEDED = ['--global_seed=7', '--clean', '--enable_checkpoint_and_export',
          f'--train_steps={STEPS}'] + launcher.TINY
# Slurm's default KillWait: what a job's processes get after a signal
# before SIGKILL.
KILL_WAIT = 30
_ENDED = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
          'OUT_OF_MEMORY')  # A requeued job passes through one: wait for
# PENDING first.


@pytest.fixture(scope='module')
def slurm(cluster):
  running = slurm_lib.SlurmCluster(cluster).start()
  try:
    yield running
  finally:
    running.stop()


@pytest.fixture(autouse=True)
def healed(slurm):
  """Each test starts on every node idle: one a test before left down or
  drained would keep its job pending until the test's time limit."""
  slurm.heal()


def _script(tmp_path, args):
  """A batch script of the kind users write: the launcher, exec'd."""
  script = tmp_path / 'job.sh'
  script.write_text('#!/bin/bash\n'
                    f'cd {runner.REPO_ROOT} && exec {sys.executable} '
                    f'{launcher.DEMO} {shlex.join(args)}\n')
  return script


def _submit(slurm, script, log, *sbatch_args):
  """The job id of `script` submitted on 3 nodes, output to `log`."""
  answer = slurm.run(['sbatch', '--parsable', '--nodes=3',
                      '--ntasks-per-node=1', f'--output={log}',
                      *sbatch_args, str(script)])
  assert answer.returncode == 0, answer.stderr
  return answer.stdout.strip().split(';')[0]


def _state(slurm, job_id):
  answer = slurm.run(['scontrol', 'show', 'job', '--oneliner', job_id])
  return re.search(r'JobState=(\S+)', answer.stdout).group(1)


def _wait_for_state(slurm, job_id, states, log, timeout=400):
  """The job's state once it is one of `states`."""
  deadline = time.monotonic() + deadlines.stretched(timeout)
  while _state(slurm, job_id) not in states:
    assert time.monotonic() < deadline, open(log).read()[-4000:]
    time.sleep(0.5)  # Polls Slurm for the job's state; not a guessed wait.
  return _state(slurm, job_id)


def _wait_for_end(slurm, job_id, log):
  return _wait_for_state(slurm, job_id, _ENDED, log)


def _one_line(output, pattern):
  found = [line for line in output.splitlines() if re.search(pattern, line)]
  assert len(found) == 1, (pattern, output[-4000:])
  return found[0]


def _on_every_node(summaries, slurm):
  return sorted(s['host']['hostname'] for s in summaries) == sorted(
      h.name for h in slurm.cluster.hosts)


def test_a_step_and_a_batch_job_run_on_every_node(slurm, tmp_path):
  names = sorted(h.name for h in slurm.cluster.hosts)
  step = slurm.run(['srun', '--nodes=3', '--ntasks=3', 'hostname'])
  assert step.returncode == 0, step.stderr
  assert sorted(step.stdout.split()) == names
  out = tmp_path / 'job.out'
  job = slurm.run(['sbatch', '--wait', '--nodes=3', f'--output={out}',
                   '--wrap', 'srun hostname'], timeout=120)
  assert job.returncode == 0, job.stderr
  assert sorted(out.read_text().split()) == names


@pytest.fixture(scope='module')
def uninterrupted(slurm, tmp_path_factory):
  """A multi_worker_mirrored job from the batch script `--dry_run
  --launcher=slurm` prints, run to its end: (each worker's
  run_summary.json, the job's output)."""
  tmp_path = tmp_path_factory.mktemp('uninterrupted')
  model_dir, log = tmp_path / 'model', tmp_path / 'job.out'
  printed = runner.call(importlib.import_module('demo_resnet_keras'), [
      '--dry_run', '--launcher=slurm', '--slurm_nodes=3',
      f'--model_dir={model_dir}'] + MIRRORED + SEEDED,
                        env={'SLURM_JOB_ID': ''})
  assert printed.returncode == 0, printed.stderr
  script = tmp_path / 'job.sh'
  script.write_text(printed.stdout)
  job = slurm.run(['sbatch', '--wait', f'--output={log}', str(script)],
                  timeout=400)
  output = log.read_text()
  assert job.returncode == 0, output[-4000:]
  return launcher.summaries(str(model_dir), 3), output


def test_the_printed_batch_script_trains_on_every_node(uninterrupted, slurm):
  """One worker per node, each TF_CONFIG from its Slurm rank and the
  nodes' addresses; the job ends at its planned step."""
  summaries, output = uninterrupted
  assert _on_every_node(summaries, slurm)
  assert {s['train_steps'] for s in summaries} == {STEPS}
  assert len({s['weights_sha256'] for s in summaries}) == 1
  assert re.search(r'slurm job \d+: 3 nodes x 1 workers', output)
  scheduler = summaries[0]['scheduler']
  assert scheduler['name'] == 'slurm' and scheduler['requeues'] == 0
  assert scheduler['nodes'] == sorted(h.name for h in slurm.cluster.hosts)


def test_a_horovod_batch_job_trains_on_every_node(slurm, tmp_path):
  """A hand-written script; the ranks started by srun --mpi=pmix."""
  model_dir, log = tmp_path / 'model', str(tmp_path / 'job.out')
  job_id = _submit(slurm, _script(tmp_path, HOROVOD + launcher.TINY + [
      '--train_steps=4', f'--model_dir={model_dir}']), log)
  assert _wait_for_end(slurm, job_id, log) == 'COMPLETED', (
      open(log).read()[-4000:])
  summaries = launcher.summaries(str(model_dir), 3)
  assert _on_every_node(summaries, slurm)
  assert {s['train_steps'] for s in summaries} == {4}
  assert len({s['weights_sha256'] for s in summaries}) == 1


def test_the_warning_signal_saves_requeues_and_resumes_exactly(
    uninterrupted, slurm, tmp_path):
  """`scancel --signal=USR1` mid-run (what #SBATCH --signal=USR1@120 sends
  before a time limit): every worker stops at the next step, the chief
  saves, every process has exited within KillWait, and the job requeues
  itself; the requeued job resumes there although its script says --clean,
  and ends with the uninterrupted run's weights."""
  model_dir, log = tmp_path / 'model', str(tmp_path / 'job.out')
  job_id = _submit(slurm, _script(tmp_path, MIRRORED + SEEDED + [
      f'--model_dir={model_dir}']), log, '--requeue', '--open-mode=append')
  launcher.wait_for_step(None, log, 4)
  signalled = time.monotonic()
  answer = slurm.run(['scancel', '--signal=USR1', job_id])
  assert answer.returncode == 0, answer.stderr
  launcher.wait_for_line(None, log, 'requeued (scontrol requeue)')
  requeued = time.monotonic()
  assert not launcher.wait_until_no_job_processes(
      slurm.cluster, timeout=signalled + KILL_WAIT - requeued,
      patterns=(launcher.TRAINER, launcher.DEMO))
  print(f'USR1: requeued {requeued - signalled:.1f} s after the signal, '
        f'every process gone {time.monotonic() - signalled:.1f} s after it')
  line = _one_line(open(log).read(), r'signalled \(SIGUSR1\)')
  saved = int(re.search(r'saved at step (\d+)', line).group(1))
  assert 4 <= saved < STEPS
  _wait_for_state(slurm, job_id, ('PENDING',), log)  # Back in the queue.
  # Slurm holds a requeued job for 120 s (its BeginTime) so that its nodes
  # are done with the last start; the test's cluster starts it once they
  # are (a new step of the same id fails while the old one's slurmstepd
  # lives).
  assert not launcher.wait_until_no_job_processes(
      slurm.cluster, timeout=60, patterns=('slurmstepd',))
  slurm.run(['scontrol', 'update', f'JobId={job_id}', 'StartTime=now'])
  assert _wait_for_end(slurm, job_id, log) == 'COMPLETED'
  output = open(log).read()
  assert f'requeued 1 time(s) by the scheduler: resuming at step {saved}' in (
      output)
  summaries = launcher.summaries(str(model_dir), 3)
  assert {s['weights_sha256'] for s in summaries} == {
      uninterrupted[0][0]['weights_sha256']}
  chief = summaries[0]
  assert chief['train_steps'] == STEPS and chief['resumed_from_step'] == saved
  scheduler = chief['scheduler']
  assert (scheduler['job_id'], scheduler['requeues']) == (job_id, 1)
  first, second = scheduler['starts']
  assert (first['step'], first['stopped_by'], first['saved_at_step']) == (
      0, 'SIGUSR1', saved)
  assert (second['requeues'], second['step']) == (1, saved)


@pytest.mark.parametrize('backend', [HOROVOD, MIRRORED],
                         ids=['horovod', 'multi_worker_mirrored'])
def test_a_lost_node_is_named_and_the_job_goes_on_without_it(slurm, tmp_path,
                                                             backend):
  """The third node's link cut mid-run: srun ends the step in bounded time
  and the launcher names the node in one line; the job, submitted with
  --no-kill and allowed --min_hosts=2 and one restart, resumes from the
  last checkpoint on the two nodes left with the global batch kept and
  ends at its planned step. Under multi_worker_mirrored the workers left
  see the lost one's silence and exit before Slurm ends the step, whose
  record then held their CPUs: the restart's step must start anyway."""
  cluster = slurm.cluster
  lost = cluster.hosts[2]  # The batch script runs on the first.
  model_dir, log = tmp_path / 'model', str(tmp_path / 'job.out')
  job_id = _submit(slurm, _script(tmp_path, backend + SEEDED + [
      f'--model_dir={model_dir}', '--min_hosts=2', '--max_restarts=1',
      '--checkpoint_interval_steps=4']), log, '--no-kill')
  try:
    launcher.wait_for_line(None, log, 'ckpt-4')
    cut = time.monotonic()
    cluster.cut_link(lost)
    launcher.wait_for_line(None, log, f'Slurm lost node {lost.name} (rank 2)',
                           timeout=120)
    named = time.monotonic()
    print(f'lost node named {named - cut:.1f} s after the cut')
    assert named - cut <= 60
    assert _wait_for_end(slurm, job_id, log) == 'COMPLETED'
  finally:
    cluster.restore_link(lost)
    slurm.heal()
  output = open(log).read()
  _one_line(output, r'job failed after \d+ s \(exit \d+\): Slurm lost node')
  _one_line(output, r'elastic: the job shrinks from 3 to 2 host\(s\)')
  summaries = launcher.summaries(str(model_dir), 2)
  chief = summaries[0]
  assert chief['train_steps'] == STEPS and chief['num_workers'] == 2
  assert {w['global_batch_size'] for w in chief['world_sizes']} == {12}
  assert [w['workers'] for w in chief['world_sizes']] == [3, 2]
  assert [s['nodes'] for s in chief['scheduler']['starts']] == [
      [h.name for h in cluster.hosts], [h.name for h in cluster.hosts[:2]]]



# The fault soak's CI tier under Slurm (testbed/soak/, docs/testing.md):
# the first two Slurm jobs of a fixed seed, 16 steps each, on this module's
# cluster, each held to an uninterrupted run of its layout: a node set DOWN
# mid-step under multi_worker_mirrored, and the preemption warning at
# start-up under Horovod.
SOAK_SEED = 26


@pytest.mark.parametrize('plan', soak_plan.draw_plan(
    SOAK_SEED, 2, ('slurm',), soak_plan.BACKENDS, steps=(16,)),
                         ids=lambda plan: f'{plan.backend}-{plan.fault}')
def test_a_soak_job_keeps_every_invariant(slurm, tmp_path, plan):
  started = time.monotonic()
  record = soak.Soak(slurm.cluster, slurm,
                     work_dir=str(tmp_path)).run_job(plan)
  print(report.HEADER, report.row(record), sep='\n')
  print(f'{time.monotonic() - started:.0f} s')
  assert record.reference_weights, record.reference_error  # Compared.
  assert record.outcome in soak_invariants.ENDED_WELL, record.last_line
  assert soak_invariants.broken_invariants(record) == []
