"""A real Slurm on the namespace cluster (testbed/slurm.py): Debian's
slurmctld and slurmd on three hosts run a job step and a batch job on every
node. The launcher does not start workers through Slurm yet; this is the
cluster its Slurm tests are to run on, checked. They need root and skip
without it, saying so."""

import os
import re
import shlex
import sys

import pytest

from testbed import cluster as cluster_lib
from testbed import slurm as slurm_lib
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
                                 reason=f'no Slurm cluster: {_missing}')]
# The cluster of this module (conftest.py): its hosts, and the subnets
# 10.77.N.0/24 it may take (the other modules' are apart).
CLUSTER_HOSTS = 3
CLUSTER_SUBNETS = range(1, 20)


@pytest.fixture(scope='module')
def slurm(cluster):
  running = slurm_lib.SlurmCluster(cluster).start()
  try:
    yield running
  finally:
    running.stop()


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
  assert os.path.exists(slurm.conf)


@pytest.mark.parametrize('backend_args', [
    ['-ds', 'multi_worker_mirrored', '--batch_size=12'],
    ['--use_horovod', '--batch_size=4']], ids=['multi_worker_mirrored',
                                              'horovod'])
def test_an_sbatch_job_trains_with_a_worker_on_every_node(slurm, tmp_path,
                                                          backend_args):
  """The launcher in a batch script: it finds the allocation, starts one
  worker per node with srun, and the job ends at its planned step with
  ranks on all three nodes (multi_worker_mirrored: TF_CONFIG from each
  task's Slurm rank and the nodes' addresses; Horovod: srun --mpi=pmix)."""
  model_dir, log = tmp_path / 'model', tmp_path / 'job.out'
  args = backend_args + ['--train_steps=4', f'--model_dir={model_dir}',
                         '--enable_checkpoint_and_export'] + launcher.TINY
  script = tmp_path / 'job.sh'
  script.write_text('#!/bin/bash\n'
                    f'cd {runner.REPO_ROOT} && exec {sys.executable} '
                    f'{launcher.DEMO} {shlex.join(args)}\n')
  job = slurm.run(['sbatch', '--wait', '--nodes=3', '--ntasks-per-node=1',
                   f'--output={log}', str(script)], timeout=400)
  output = log.read_text()
  assert job.returncode == 0, output[-4000:]
  summaries = launcher.summaries(str(model_dir), 3)
  hosts = sorted(s['host']['hostname'] for s in summaries)
  assert hosts == sorted(h.name for h in slurm.cluster.hosts)
  assert {s['train_steps'] for s in summaries} == {4}
  assert len({s['weights_sha256'] for s in summaries}) == 1
  assert re.search(r'slurm job \d+: 3 nodes x 1 workers', output)
