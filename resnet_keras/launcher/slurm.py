"""Workers started by Slurm inside the job's allocation (`sbatch`, `salloc`):
the nodes come from the allocation, each worker is a task of one `srun`
step (no hostfile, no ssh between compute nodes), and Slurm notices a lost
node and ends the step.

Under multi_worker_mirrored each task derives its TF_CONFIG from its Slurm
rank (SLURM_PROCID of SLURM_STEP_NUM_TASKS, common/launch.py) and the
nodes' addresses, which the launcher passes as MULTI_HLS_IPS (Slurm's
NodeAddr: a node's name need not resolve). Horovod's ranks are started by
`srun --mpi=pmix` (OpenMPI takes its rank from PMIx).

Outside an allocation, --dry_run --launcher=slurm prints the batch script
(`batch_script`) that submits the launch with sbatch. The tf.data service's
servers start over ssh, which an allocation does not give between its
nodes: under Slurm --data_service_hosts is refused, with what to do instead.
"""

import re
import shlex
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence

from absl import logging

from common import launch
from common.errors import UsageError
from resnet_keras.launcher import placement
from resnet_keras.launcher.options import LaunchConfig

JOB_ID_VAR = 'SLURM_JOB_ID'
_BRACKETS = re.compile(r'^([^\[]*)\[([^\]]*)\](.*)$')


def in_allocation(environ: Mapping[str, str]) -> bool:
  return bool(environ.get(JOB_ID_VAR))


def prints_batch_script(cfg: LaunchConfig, environ: Mapping[str, str]) -> bool:
  """Whether the launch prints a batch script (--dry_run --launcher=slurm
  outside an allocation) instead of planning or running its workers."""
  prints = (cfg.dry_run and cfg.launcher == 'slurm' and
            not in_allocation(environ))
  if cfg.slurm_nodes and in_allocation(environ):
    raise UsageError(f'--slurm_nodes={cfg.slurm_nodes}: inside a Slurm '
                     f'allocation ({JOB_ID_VAR}={environ[JOB_ID_VAR]}) the '
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


def expand_nodelist(nodelist: str) -> List[str]:
  """Slurm's compressed host list ('s[1-3,7]', 'a1,b[01-02]',
  'r[1-2]-n[1-2]') as the node names, in order."""
  nodes = []
  for item in _top_level_items(nodelist):
    match = _BRACKETS.match(item)
    if not match:
      nodes.append(item)
      continue
    prefix, ranges, rest = match.groups()
    for number in _numbers(ranges, nodelist):
      nodes += expand_nodelist(prefix + number + rest)
  return nodes


def _top_level_items(nodelist: str) -> List[str]:
  items, depth, start = [], 0, 0
  for i, char in enumerate(nodelist):
    depth += {'[': 1, ']': -1}.get(char, 0)
    if char == ',' and depth == 0:
      items.append(nodelist[start:i])
      start = i + 1
  items.append(nodelist[start:])
  return [item for item in items if item]


def _numbers(ranges: str, nodelist: str) -> List[str]:
  numbers = []
  for part in ranges.split(','):
    first, _, last = part.partition('-')
    if not first.isdigit() or (last and not last.isdigit()):
      raise UsageError(f'cannot read the Slurm node list {nodelist!r}')
    # Slurm pads each number to the width of the range's first.
    numbers += [str(n).zfill(len(first))
                for n in range(int(first), int(last or first) + 1)]
  return numbers


def tasks_per_node(value: str) -> List[int]:
  """SLURM_TASKS_PER_NODE ('2(x3),1') as one count per node."""
  counts = []
  for part in value.split(','):
    match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
    if not match:
      raise UsageError(f'cannot read SLURM_TASKS_PER_NODE={value!r}')
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def node_addresses(nodes: Sequence[str]) -> List[str]:
  """Each node's address as Slurm knows it (its NodeAddr)."""
  try:
    answer = subprocess.run(['scontrol', 'show', 'node', ','.join(nodes)],
                            capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return list(nodes)  # Their names, then, as a dry run away from Slurm.
  found = dict(re.findall(r'NodeName=(\S+).*?NodeAddr=(\S+)', answer.stdout,
                          re.S))
  return [found.get(node, node) for node in nodes]


class Slurm(placement.Placement):
  """The allocation's nodes; `cfg.num_workers_per_hls` tasks on each."""

  def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str],
               hosts: Sequence[str], use_horovod: bool,
               addresses: Optional[Sequence[str]] = None):
    refuse_data_service(cfg)
    nodes = expand_nodelist(environ.get('SLURM_JOB_NODELIST', ''))
    if not nodes:
      raise UsageError(f'{JOB_ID_VAR} is set but SLURM_JOB_NODELIST names no '
                       'node: run inside an sbatch or salloc allocation')
    del hosts  # The allocation's nodes, not MULTI_HLS_IPS.
    super().__init__(cfg, environ, nodes)
    self.job_id = environ[JOB_ID_VAR]
    self._use_horovod = use_horovod
    self.addresses = list(addresses) if addresses else node_addresses(nodes)
    self.environ['MULTI_HLS_IPS'] = ','.join(self.addresses)
    allocated = environ.get('SLURM_TASKS_PER_NODE')
    if allocated and set(tasks_per_node(allocated)) != {
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
    argv = ['srun', f'--nodes={len(nodes)}', f'--nodelist={",".join(nodes)}',
            f'--ntasks-per-node={self.cfg.num_workers_per_hls}',
            f'--ntasks={len(nodes) * self.cfg.num_workers_per_hls}',
            '--kill-on-bad-exit=1', '--job-name=resnet_keras_train',
            '--export=ALL']
    if self._use_horovod:
      argv.append('--mpi=pmix')
    env = {**extra_env, 'MULTI_HLS_IPS': ','.join(
        self.addresses[list(self.hosts).index(n)] for n in nodes)}
    return launch.Launch(argv=argv + list(trainer_argv), env=env, files={},
                         notes=[])

  def parses_output(self, plan: launch.Launch) -> bool:
    return False
