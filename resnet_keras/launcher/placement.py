"""The seam between a job and the ways its workers start: one Placement
per way, each in a module of its own.

  this_host.py   one process, or mpirun on this host
  ssh_hosts.py   mpirun over ssh on the hosts of MULTI_HLS_IPS, checked
                 before anything starts (preflight.py)
  kubeflow.py    an external launcher (a Kubeflow MPIJob) started this rank:
                 run it in-process
  slurm.py       the tasks of an srun step, inside a Slurm allocation

A Placement says which hosts a job may use, which of them are ready now,
and the command (argv, environment, files) that starts an attempt's
workers on some of them, as data: --dry_run prints it, the supervisor runs
it. The job (job.py) owns what is placement-independent: the batch split on
the hosts it gets, restarts, the trainer's flags, the tf.data service.
A new way of starting workers is one module with a Placement subclass, and
its place in registry.PLACEMENTS. A scheduler's placement also says when
its environment is present (`chosen`), prints its batch script
(`batch_nodes`, `batch_script`), reads its launcher's output
(`launcher_output`) and asks for a requeue (`stopped_at_warning`): nothing
outside its module names the scheduler.
"""

import abc
import json
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

from absl import logging

from common import worker_contract
from common.errors import STOPPED_AT_WARNING_EXIT_CODE, WARNING_SIGNAL
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import preflight
from resnet_keras.launcher import failures
from resnet_keras.launcher.launch_config import LaunchConfig

# The trainer, which every placement starts on each worker (at the same
# path on every host).
TRAINER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), 'resnet_ctl_imagenet_main.py')

FILES_DIR_PREFIX = 'resnet_keras_launch_'


class Placement(abc.ABC):
  """How and where the workers of one launch start."""

  # Whether `check` asks the hosts over the network: the job then also
  # names the ports the workers will listen on, for them to be checked free.
  asks_hosts = False
  # Where the hosts come from, for messages.
  hosts_source = worker_contract.HOSTS_VAR
  # Whether a fail-stop job checks its hosts again before a restart (an
  # elastic job always does).
  checks_at_restart = False
  # How port_guard.py reaches the hosts: this_host (its rules here) or
  # ssh_hosts (over the launcher's ssh).
  guard_kind = 'this_host'
  # Why port_guard.py adds no rules where this placement runs the workers,
  # as the launcher's line says it ('': it can).
  guard_refused = ''
  # What the supervisor reads in the output of this placement's command,
  # beyond mpirun's lines.
  launcher_output = failures.LauncherOutput()

  @classmethod
  def chosen(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str]) -> bool:
    """Whether this launch's options and environment (`hosts`: its
    MULTI_HLS_IPS) ask for this placement; UsageError where they ask for it
    but it cannot run here. registry.PLACEMENTS asks each in turn."""
    del cfg, environ, hosts
    return True

  @classmethod
  def create(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str], use_horovod: bool) -> 'Placement':
    del use_horovod
    return cls(cfg, environ, hosts)

  @classmethod
  def batch_nodes(cls, cfg: LaunchConfig, environ: Mapping[str, str]) -> int:
    """The nodes of the scheduler's batch script this launch prints instead
    of planning or running its workers (0: it prints none)."""
    del cfg, environ
    return 0

  @classmethod
  def batch_script(cls, argv: Sequence[str], recipe: Mapping[str, Any],
                   cfg: LaunchConfig, nodes: int, cpus_per_task: int,
                   python: str, repo_dir: str) -> str:
    """The script that submits the launch `argv` (the launcher's command
    line; `recipe`: what --config filled in) on `nodes` nodes, where
    `batch_nodes` asks for one."""
    raise NotImplementedError(f'{cls.__name__} has no batch script')

  def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str],
               hosts: Sequence[str]):
    self.cfg, self.environ = cfg, dict(environ)
    self.hosts = tuple(hosts)  # The planned hosts; empty: this host.
    # Where an attempt's files (mpirun's hostfile) go: the private
    # directory the job makes for a launch (job.AttemptFiles); a dry
    # run, which makes none, shows its form.
    self.files_dir = os.path.join(tempfile.gettempdir(),
                                  FILES_DIR_PREFIX + 'XXXXXXXX')

  def headline(self) -> str:
    """The launcher's first line about where the job runs ('': none)."""
    return ''

  @property
  def total_workers(self) -> int:
    return self.workers_on(self.hosts)

  def workers_on(self, hosts: Sequence[str]) -> int:
    """The workers of an attempt on `hosts` (empty: this host)."""
    return self.cfg.num_workers_per_hls * max(1, len(hosts))

  def check(self, hosts: Sequence[str], want: preflight.Expected,
            ports: Mapping[str, Sequence[int]],
            timeout: int = preflight.SSH_TIMEOUT) -> preflight.Report:
    """Which of `hosts` can run workers now, each asked within `timeout`
    seconds (default: all of them, asking nothing)."""
    del want, ports, timeout
    return preflight.Report([], 1, tuple(hosts))

  def check_lines(self, want: preflight.Expected,
                  ports: Mapping[str, Sequence[int]]) -> List[str]:
    """The checks `check` makes, as --dry_run prints them."""
    del want, ports
    return []

  @abc.abstractmethod
  def command(self, trainer_argv: Sequence[str], hosts: Sequence[str],
              extra_env: Dict[str, str],
              hosts_per_machine: int) -> launch.Launch:
    """What starts `trainer_argv` on every worker of `hosts` (the planned
    ones, or those an elastic job goes on with)."""

  def parses_output(self, plan: launch.Launch) -> bool:
    """Whether the supervisor reads `plan`'s output to name a failure
    (mpirun's account of a lost rank or host; a scheduler's placement adds
    its launcher's)."""
    return plan.argv[0] == 'mpirun'

  def stopped_at_warning(self, step: Optional[int]) -> int:
    """The workers saved at `step` and stopped at a scheduler's warning
    signal (common/errors.py): what follows, and the launch's exit code."""
    logging.error('the workers stopped at %s (a scheduler\'s warning) and '
                  'saved at step %s: rerun the same command to resume there',
                  WARNING_SIGNAL.name, step)
    return STOPPED_AT_WARNING_EXIT_CODE

  def tf_configs(self, total_workers: int) -> List[str]:
    """multi_worker_mirrored: the ranks' TF_CONFIG (each derives its own
    from its MPI rank), as --dry_run shows it: the cluster they share once,
    then what differs, each rank's task index and address. Every rank's in
    full was 20 MB at 1,000 workers."""
    config = worker_contract.tf_config_from_env(0, total_workers,
                                                self.environ)
    config['task']['index'] = 'RANK'
    name = worker_contract.TF_CONFIG_VAR
    return [f'{name} of each rank: {json.dumps(config)}'] + [
        f'{name} rank {rank}: task index {rank}, listens on {address}'
        for rank, address in enumerate(config['cluster']['worker'])]

  def _one_process_or_mpirun(self, trainer_argv: Sequence[str],
                             hosts: Sequence[str], extra_env: Dict[str, str],
                             hosts_per_machine: int) -> launch.Launch:
    """One worker in all: the program itself; more: mpirun on `hosts`."""
    if self.workers_on(hosts) == 1:
      return launch.Launch(argv=list(trainer_argv), env=extra_env, files={},
                           notes=[])
    hostfile = os.path.join(self.files_dir, 'hostfile')
    return launch.mpirun_command(
        trainer_argv, workers_per_host=self.cfg.num_workers_per_hls,
        hosts=hosts,
        physical_cores=launch.physical_core_count(), environ=self.environ,
        hostfile_path=hostfile, extra_env=extra_env,
        failure_timeout=self.cfg.failure_timeout,
        hosts_per_machine=hosts_per_machine, as_root=os.geteuid() == 0)

