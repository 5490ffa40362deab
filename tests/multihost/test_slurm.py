"""A real Slurm on the namespace cluster (testbed/slurm.py): Debian's
slurmctld and slurmd on three hosts run a job step and a batch job on every
node. The launcher does not start workers through Slurm yet; this is the
cluster its Slurm tests are to run on, checked. They need root and skip
without it, saying so."""

import os

import pytest

from testbed import cluster as cluster_lib
from testbed import slurm as slurm_lib


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
