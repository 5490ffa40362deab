"""Workers started by Slurm inside the job's allocation (`sbatch`, `salloc`):
the nodes come from the allocation, each worker is a task of one `srun`
step (no hostfile, no ssh between compute nodes), and Slurm notices a lost
node and ends the step.

Under multi_worker_mirrored each task derives its TF_CONFIG from its Slurm
rank (SLURM_PROCID of SLURM_STEP_NUM_TASKS, common/launch.py) and the
nodes' addresses, which the launcher passes as MULTI_HLS_IPS (Slurm's
NodeAddr: a node's name need not resolve). Horovod's ranks are started by
`srun --mpi=pmix` (OpenMPI takes its rank from PMIx).

What Slurm does it keeps doing: it notices a lost node (srun's "Node
failure on X", which the supervisor names), and sends the warning signal
(--signal) to the workers, which save and stop; the launcher then requeues
the job (`stopped_at_warning`). A job submitted with --no-kill keeps its
other nodes: each restart runs on those it still holds (`check`), as an
elastic job with --min_hosts.

Outside an allocation, --dry_run --launcher=slurm prints the batch script
(`batch_script`) that submits the launch with sbatch. The tf.data service's
servers start over ssh, which an allocation does not give between its
nodes: under Slurm --data_service_hosts is refused, with what to do instead.
"""

import os
import shlex
import signal
from typing import Any, Dict, List, Mapping, Optional, Sequence

from absl import logging

from common import launch
from common import preflight
from common import slurm
from common.errors import (STOPPED_AT_WARNING_EXIT_CODE, WARNING_SIGNAL,
                           UsageError)
from resnet_keras import flags as flags_lib
from resnet_keras.launcher import placement
from resnet_keras.launcher.options import LaunchConfig

# Each attempt's step shares the CPUs with the steps before it. After a lost
# node the previous step stays RUNNING in slurmctld's view (its part on the
# lost node never reports its end) and holds the CPUs of the nodes left, so
# the restart's step waited for them for good ('Requested nodes are busy')
# where multi_worker_mirrored's workers had already left it; with
# --overlap it starts at once on those nodes.
STEP_OVERLAP = '--overlap'

def prints_batch_script(cfg: LaunchConfig, environ: Mapping[str, str]) -> bool:
  """Whether the launch prints a batch script (--dry_run --launcher=slurm
  outside an allocation) instead of planning or running its workers."""
  prints = (cfg.dry_run and cfg.launcher == 'slurm' and
            not slurm.in_allocation(environ))
  if cfg.slurm_nodes and slurm.in_allocation(environ):
    raise UsageError(f'--slurm_nodes={cfg.slurm_nodes}: inside a Slurm '
                     f'allocation ({slurm.JOB_ID_VAR}='
                     f'{environ[slurm.JOB_ID_VAR]}) the '
                     'nodes are the allocation\'s; drop --slurm_nodes')
  if cfg.slurm_nodes and not prints:
    raise UsageError(f'--slurm_nodes={cfg.slurm_nodes} sets the nodes of the '
                     'batch script that --dry_run --launcher=slurm prints: '
                     'add both, or drop --slurm_nodes')
  return prints


def refuse_data_service(cfg: LaunchConfig) -> None:
  if cfg.data_service_hosts:
    raise UsageError(
        '--data_service_hosts starts the tf.data service over ssh, which a '
        'Slurm allocation does not give between its nodes: start the service '
        'outside the job (python -m resnet_keras.data.service dispatcher, and '
        'worker on each data host; docs/multi_host.md) and pass its address '
        'with --tf_data_service grpc://HOST:PORT, or run with --launcher=ssh '
        'on hosts that allow ssh')


def _relative_path(name: str, value: Any) -> bool:
  """Whether flag `name`'s `value` is a path on this host, relative to the
  working directory: a path option's, or --config's naming a file (not a
  recipe's name)."""
  if not isinstance(value, str) or not value or os.path.isabs(value) or (
      '://' in value):  # gs://, hdfs://: not this host's paths.
    return False
  return name in flags_lib.PATH_FLAGS or (name == 'config' and
                                          os.path.isfile(value))


def absolute_paths(argv: Sequence[str],
                   recipe: Mapping[str, Any]) -> List[str]:
  """`argv` (options.as_parsed: each value joined to its flag) with every
  path the user gave made absolute from the working directory, for a
  script that runs elsewhere: a path flag's, --config's file, and a path
  the recipe filled in (`recipe`: what it filled in), added as a flag.
  Spellings are kept (-md=/abs/runs/x)."""
  out = []
  for arg in argv:
    name, joined, value = arg.partition('=')
    if arg.startswith('-') and joined and _relative_path(name.lstrip('-'),
                                                         value):
      arg = f'{name}={os.path.abspath(value)}'
    out.append(arg)
  return out + [f'--{name}={os.path.abspath(value)}'
                for name, value in recipe.items()
                if _relative_path(name, value)]


def batch_script(argv: Sequence[str], cfg: LaunchConfig, nodes: int,
                 cpus_per_task: int, python: str, repo_dir: str) -> str:
  """The sbatch script that makes the launch `argv` (the launcher's command
  line, --dry_run and all) on `nodes` nodes: the launcher again, inside the
  allocation, with `python` from `repo_dir`."""
  launcher_argv = launch.strip_flags(argv[1:], ('dry_run',),
                                     ('slurm_nodes', 'launcher'))
  command = [python, 'demo_resnet_keras.py', *launcher_argv,
             '--launcher=slurm']
  return '\n'.join([
      '#!/bin/bash',
      '#SBATCH --job-name=resnet_keras',
      f'#SBATCH --nodes={nodes}',
      f'#SBATCH --ntasks-per-node={cfg.num_workers_per_hls}',
      '# This host\'s physical cores per worker: set it to the compute '
      'nodes\'.',
      f'#SBATCH --cpus-per-task={cpus_per_task}',
      '#SBATCH --signal=USR1@120',
      '#SBATCH --requeue',
      '# A requeued job appends to its output instead of truncating it.',
      '#SBATCH --open-mode=append',
      '#SBATCH --output=resnet_keras-%j.out',
      f'cd {shlex.quote(repo_dir)}',
      f'exec {shlex.join(command)}',
  ]) + '\n'


class Slurm(placement.Placement):
  """The allocation's nodes; `cfg.num_workers_per_hls` tasks on each."""

  guard_kind = 'slurm'
  # Each restart asks Slurm which nodes the job still holds (one scontrol).
  checks_at_restart = True

  def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str],
               hosts: Sequence[str], use_horovod: bool,
               addresses: Optional[Sequence[str]] = None):
    refuse_data_service(cfg)
    nodes = slurm.expand_nodelist(environ.get('SLURM_JOB_NODELIST', ''))
    if not nodes:
      raise UsageError(f'{slurm.JOB_ID_VAR} is set but SLURM_JOB_NODELIST '
                       'names no node: run inside an sbatch or salloc '
                       'allocation')
    del hosts  # The allocation's nodes, not MULTI_HLS_IPS.
    super().__init__(cfg, environ, nodes)
    self.job_id = environ[slurm.JOB_ID_VAR]
    self.hosts_source = f'slurm job {self.job_id}'
    self._use_horovod = use_horovod
    self.addresses = (list(addresses) if addresses else
                      slurm.node_addresses(nodes))
    self.environ['MULTI_HLS_IPS'] = ','.join(self.addresses)
    allocated = environ.get('SLURM_TASKS_PER_NODE')
    if allocated and set(slurm.tasks_per_node(allocated)) != {
        cfg.num_workers_per_hls}:
      logging.error('--num_workers_per_hls=%d: %d worker(s) on each node, '
                    'where the allocation has %s task(s) per node '
                    '(SLURM_TASKS_PER_NODE)', cfg.num_workers_per_hls,
                    cfg.num_workers_per_hls, allocated)

  def headline(self) -> str:
    return (f'slurm job {self.job_id}: {len(self.hosts)} nodes x '
            f'{self.cfg.num_workers_per_hls} workers')

  def command(self, trainer_argv: Sequence[str], hosts: Sequence[str],
              extra_env: Dict[str, str],
              hosts_per_machine: int) -> launch.Launch:
    del hosts_per_machine  # Slurm binds each task to its CPUs.
    nodes = list(hosts) or list(self.hosts)
    # Slurm's compressed form: 'n[0001-1000]', not 6 KB of names.
    argv = ['srun', f'--nodes={len(nodes)}',
            f'--nodelist={slurm.compress_nodelist(nodes)}',
            f'--ntasks-per-node={self.cfg.num_workers_per_hls}',
            f'--ntasks={len(nodes) * self.cfg.num_workers_per_hls}',
            '--kill-on-bad-exit=1', '--job-name=resnet_keras_train',
            '--export=ALL', STEP_OVERLAP]
    if self._use_horovod:
      argv.append('--mpi=pmix')
    address = dict(zip(self.hosts, self.addresses))
    env = {**extra_env, 'MULTI_HLS_IPS': ','.join(address[n] for n in nodes)}
    return launch.Launch(argv=argv + list(trainer_argv), env=env, files={},
                         notes=[])

  def check(self, hosts: Sequence[str], want: preflight.Expected,
            ports: Mapping[str, Sequence[int]]) -> preflight.Report:
    """The nodes of `hosts` the job still holds: a job submitted with
    --no-kill runs on without a node that failed."""
    del want, ports
    held = slurm.job_nodes(self.job_id)
    if held is None:  # Slurm cannot tell: srun will.
      return preflight.Report([], 1, tuple(hosts))
    held = set(held)
    return preflight.Report(
        [f'node {node}: no longer in slurm job {self.job_id} (Slurm took '
         'it out: it failed)' for node in hosts if node not in held],
        1, tuple(node for node in hosts if node in held))

  def stopped_at_warning(self, step: Optional[int]) -> int:
    """Slurm's warning (#SBATCH --signal, scancel --signal): the job goes
    back in the queue, and resumes at `step` when Slurm starts it again."""
    # Requeueing ends this batch script with SIGTERM: the line comes first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    refused = slurm.requeue(self.job_id)
    logging.error(
        'slurm job %s signalled (%s): the workers saved at step %s and '
        'stopped; %s', self.job_id, WARNING_SIGNAL.name, step,
        f'not requeued ({refused}): resubmit the batch script to resume there'
        if refused else 'requeued (scontrol requeue): it resumes there when '
        'Slurm starts it again')
    return STOPPED_AT_WARNING_EXIT_CODE
