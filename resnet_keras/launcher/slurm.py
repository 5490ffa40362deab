"""Workers started by Slurm inside the job's allocation (`sbatch`, `salloc`):
the nodes come from the allocation, each worker is a task of one `srun`
step (no hostfile, no ssh between compute nodes), and Slurm notices a lost
node and ends the step.

Under multi_worker_mirrored each task derives its TF_CONFIG from its Slurm
rank (SLURM_PROCID of SLURM_STEP_NUM_TASKS: common/worker_contract.py) and
the nodes' addresses, which the launcher passes as MULTI_HLS_IPS (Slurm's
NodeAddr: a node's name need not resolve). Horovod's ranks are started by
`srun --mpi=pmix` (OpenMPI takes its rank from PMIx).

What Slurm does it keeps doing: it notices a lost node (srun's "Node
failure on X", which `SrunOutput` reads for the supervisor), and sends the warning signal
(--signal) to the workers, which save and stop; the launcher then requeues
the job (`stopped_at_warning`). A job submitted with --no-kill keeps its
other nodes: each restart runs on those it still holds (`check`), as an
elastic job with --min_hosts.

Outside an allocation, --dry_run --launcher=slurm prints the batch script
(`batch_script`) that submits the launch with sbatch. The tf.data service's
servers start over ssh, which an allocation does not give between its
nodes: under Slurm --data_service_hosts is refused, with what to do instead.

All of Slurm the launcher knows is here (the worker contract names the
variables): whether the launch is in an allocation (`Slurm.chosen`), the
batch script, srun's lines, scontrol (node addresses, the nodes a job still
holds, the requeue). registry.py lists the placement first.
"""

import os
import re
import shlex
import signal
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging

from common import slurm as node_lists
from common import worker_contract as contract
from common.errors import (STOPPED_AT_WARNING_EXIT_CODE, WARNING_SIGNAL,
                           UsageError)
from resnet_keras.config import flags as flags_lib
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import placement
from resnet_keras.launcher import preflight
from resnet_keras.launcher import failures
from resnet_keras.launcher.launch_config import LaunchConfig

# Each attempt's step shares the CPUs with the steps before it. After a lost
# node the previous step stays RUNNING in slurmctld's view (its part on the
# lost node never reports its end) and holds the CPUs of the nodes left, so
# the restart's step waited for them for good ('Requested nodes are busy')
# where multi_worker_mirrored's workers had already left it; with
# --overlap it starts at once on those nodes.
STEP_OVERLAP = '--overlap'
# srun's word when Slurm found a node of the step down.
_NODE_FAILURE = re.compile(r'Node failure on (\S+)')
# srun's line for each task that exits with an error or a signal (its
# strsignal text: "Segmentation fault", "User defined signal 1"), the
# first one first.
_TASK_EXIT = re.compile(r'srun: error: (\S+): task (\d+): (?:Exited with '
                        r'exit code (\d+)|(.+?))\s*$', re.MULTILINE)
_SIGNAL_OF_TEXT = {signal.strsignal(s): s for s in signal.Signals
                   if signal.strsignal(s)}


def prints_batch_script(cfg: LaunchConfig, environ: Mapping[str, str]) -> bool:
  """Whether the launch prints a batch script (--dry_run --launcher=slurm
  outside an allocation) instead of planning or running its workers."""
  prints = (cfg.dry_run and cfg.launcher == 'slurm' and
            not contract.in_slurm_allocation(environ))
  if cfg.slurm_nodes and contract.in_slurm_allocation(environ):
    raise UsageError(f'--slurm_nodes={cfg.slurm_nodes}: inside a Slurm '
                     f'allocation ({contract.SLURM_JOB_ID_VAR}='
                     f'{contract.slurm_job_id(environ)}) the '
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
  """`argv` (launch_config.as_parsed: each value joined to its flag) with every
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


def tasks_per_node(value: str) -> List[int]:
  """Slurm's tasks per node ('2(x3),1') as one count per node."""
  counts = []
  for part in value.split(','):
    match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
    if not match:
      raise UsageError(f'cannot read {contract.SLURM_TASKS_PER_NODE_VAR}='
                       f'{value!r}: Slurm writes counts per node such as '
                       '2(x3),1; run inside an sbatch or salloc allocation, '
                       'or unset it')
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def node_addresses(nodes: Sequence[str]) -> List[str]:
  """Each node's address as Slurm knows it (its NodeAddr); their names
  where Slurm cannot be asked (a dry run away from it)."""
  done, answer = _scontrol('show', 'node', ','.join(nodes))
  found = dict(re.findall(r'NodeName=(\S+).*?NodeAddr=(\S+)', answer, re.S)
               if done else [])
  return [found.get(node, node) for node in nodes]


def _scontrol(*args: str) -> Tuple[bool, str]:
  """(whether scontrol did it, its answer or why not)."""
  try:
    answer = subprocess.run(['scontrol', *args], capture_output=True,
                            text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, str(e)
  if answer.returncode:
    return False, (answer.stderr.strip() or
                   f'scontrol exited with code {answer.returncode}')
  return True, answer.stdout


def job_nodes(job_id: str) -> Optional[List[str]]:
  """The nodes job `job_id` holds now (a job submitted with --no-kill
  loses a failed node and runs on), or None where Slurm cannot tell."""
  done, answer = _scontrol('show', 'job', '--oneliner', job_id)
  found = done and re.search(r'(?:^|\s)NodeList=(\S+)', answer)
  return node_lists.expand_nodelist(found.group(1)) if found else None


def requeue(job_id: str) -> Optional[str]:
  """Puts job `job_id` back in the queue (it starts again from its batch
  script, SLURM_RESTART_COUNT one higher); None, or why Slurm refused."""
  done, answer = _scontrol('requeue', job_id)
  return None if done else answer


class SrunOutput(failures.LauncherOutput):
  """srun's own lines: a node Slurm found down, and each task that exited
  with an error."""

  def lost_node(self, text: str, hosts: Sequence[str],
                workers_per_host: int) -> str:
    node = _NODE_FAILURE.search(text)
    if not node:
      return ''
    return (f'Slurm lost node {node.group(1)}'
            f'{failures.ranks_on(node.group(1), hosts, workers_per_host)}: '
            'it went down or its network failed')

  def first_task_exit(self, text: str) -> Optional[Tuple[str, int, int]]:
    task = _TASK_EXIT.search(text)
    if not task:
      return None
    host, rank, code, killed_by = task.groups()
    if code is not None:
      return host, int(rank), int(code)
    if killed_by in _SIGNAL_OF_TEXT:  # The shell's code for it.
      return host, int(rank), 128 + _SIGNAL_OF_TEXT[killed_by]
    return None  # Words of srun's own: a later task's line is not first.

  def stopped_note(self, text: str, failure: failures.Failure) -> str:
    """Slurm ends a job that lost a node with a signal to its batch script
    (the launcher): the node srun named, if that is why."""
    if not _NODE_FAILURE.search(text):
      return ''
    return (f': {failure.cause}; Slurm ends the job (and requeues it where '
            'it may: it resumes at the last checkpoint); sbatch --no-kill '
            'keeps a job that loses a node, and --max_restarts restarts it '
            'on the nodes left')


class Slurm(placement.Placement):
  """The allocation's nodes; `cfg.num_workers_per_hls` tasks on each."""

  guard_refused = ('not applied under Slurm (it cannot remove rules from the '
                   'nodes Slurm takes back)')
  # Each restart asks Slurm which nodes the job still holds (one scontrol).
  checks_at_restart = True
  launcher_output = SrunOutput()

  @classmethod
  def chosen(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str]) -> bool:
    """--launcher=slurm (which needs an allocation), or an allocation's
    environment under --launcher=auto."""
    del hosts
    in_allocation = contract.in_slurm_allocation(environ)
    if cfg.launcher == 'slurm' and not in_allocation:
      raise UsageError('--launcher=slurm runs inside a Slurm allocation: '
                       'submit the launch with sbatch (--dry_run prints a '
                       'batch script for it) or run it in salloc')
    return cfg.launcher == 'slurm' or (cfg.launcher == 'auto' and
                                       in_allocation)

  @classmethod
  def create(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str], use_horovod: bool) -> 'Slurm':
    return cls(cfg, environ, hosts, use_horovod)

  @classmethod
  def batch_nodes(cls, cfg: LaunchConfig, environ: Mapping[str, str]) -> int:
    """--dry_run --launcher=slurm outside an allocation: the nodes of the
    batch script it prints (--slurm_nodes, or MULTI_HLS_IPS's hosts)."""
    if not prints_batch_script(cfg, environ):
      return 0
    refuse_data_service(cfg)
    return cfg.slurm_nodes or len(contract.hosts(environ)) or 1

  @classmethod
  def batch_script(cls, argv: Sequence[str], recipe: Mapping[str, Any],
                   cfg: LaunchConfig, nodes: int, cpus_per_task: int,
                   python: str, repo_dir: str) -> str:
    return batch_script(absolute_paths(argv, recipe), cfg, nodes,
                        cpus_per_task, python, repo_dir)

  def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str],
               hosts: Sequence[str], use_horovod: bool,
               addresses: Optional[Sequence[str]] = None):
    refuse_data_service(cfg)
    nodes = contract.slurm_job_nodes(environ)
    if not nodes:
      raise UsageError(f'{contract.SLURM_JOB_ID_VAR} is set but '
                       f'{contract.SLURM_JOB_NODELIST_VAR} names no node: run '
                       'inside an sbatch or salloc allocation')
    del hosts  # The allocation's nodes, not MULTI_HLS_IPS.
    super().__init__(cfg, environ, nodes)
    self.job_id = contract.slurm_job_id(environ)
    self.hosts_source = f'slurm job {self.job_id}'
    self._use_horovod = use_horovod
    self.addresses = (list(addresses) if addresses else
                      node_addresses(nodes))
    self.environ.update(contract.hosts_env(self.addresses))
    allocated = contract.slurm_tasks_per_node(environ)
    if allocated and set(tasks_per_node(allocated)) != {
        cfg.num_workers_per_hls}:
      logging.error('--num_workers_per_hls=%d: %d worker(s) on each node, '
                    'where the allocation has %s task(s) per node '
                    '(%s)', cfg.num_workers_per_hls, cfg.num_workers_per_hls,
                    allocated, contract.SLURM_TASKS_PER_NODE_VAR)

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
            f'--nodelist={node_lists.compress_nodelist(nodes)}',
            f'--ntasks-per-node={self.cfg.num_workers_per_hls}',
            f'--ntasks={len(nodes) * self.cfg.num_workers_per_hls}',
            '--kill-on-bad-exit=1', '--job-name=resnet_keras_train',
            '--export=ALL', STEP_OVERLAP]
    if self._use_horovod:
      argv.append('--mpi=pmix')
    address = dict(zip(self.hosts, self.addresses))
    env = {**extra_env, **contract.hosts_env([address[n] for n in nodes])}
    return launch.Launch(argv=argv + list(trainer_argv), env=env, files={},
                         notes=[])

  def parses_output(self, plan: launch.Launch) -> bool:
    """srun's lines name a lost node and the first task to fail."""
    del plan
    return True

  def check(self, hosts: Sequence[str], want: preflight.Expected,
            ports: Mapping[str, Sequence[int]],
            timeout: int = preflight.SSH_TIMEOUT) -> preflight.Report:
    """The nodes of `hosts` the job still holds: a job submitted with
    --no-kill runs on without a node that failed."""
    del want, ports, timeout  # One scontrol, here.
    held = job_nodes(self.job_id)
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
    refused = requeue(self.job_id)
    logging.error(
        'slurm job %s signalled (%s): the workers saved at step %s and '
        'stopped; %s', self.job_id, WARNING_SIGNAL.name, step,
        f'not requeued ({refused}): resubmit the batch script to resume there'
        if refused else 'requeued (scontrol requeue): it resumes there when '
        'Slurm starts it again')
    return STOPPED_AT_WARNING_EXIT_CODE
