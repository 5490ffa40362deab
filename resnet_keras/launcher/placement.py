"""The seam between a job and the ways its workers start: one Placement
per way, each in a module of its own.

  this_host.py   one process, or mpirun on this host
  ssh_hosts.py   mpirun over ssh on the hosts of MULTI_HLS_IPS, checked
                 before anything starts (common/preflight.py)
  kubeflow.py    an external launcher (a Kubeflow MPIJob) started this rank:
                 run it in-process
  slurm.py       the tasks of an srun step, inside a Slurm allocation

A Placement says which hosts a job may use, which of them are ready now,
and the command (argv, environment, files) that starts an attempt's
workers on some of them, as data: --dry_run prints it, the supervisor runs
it. The job (job.py) owns what is placement-independent: the batch split on
the hosts it gets, restarts, the trainer's flags, the tf.data service.
A new way of starting workers is one module with a Placement subclass, and
its line in main.placement_for.
"""

import abc
import json
import os
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence

from absl import logging

from common import launch
from common import preflight
from common.errors import STOPPED_AT_WARNING_EXIT_CODE, WARNING_SIGNAL
from resnet_keras.launcher.options import LaunchConfig

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
  hosts_source = 'MULTI_HLS_IPS'  # Where the hosts come from, for messages.
  # Whether a fail-stop job checks its hosts again before a restart (an
  # elastic job always does).
  checks_at_restart = False
  # How port_guard.py reaches its hosts (this_host, ssh_hosts), or why it
  # cannot (slurm, kubernetes).
  guard_kind = 'this_host'

  def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str],
               hosts: Sequence[str]):
    self.cfg, self.environ = cfg, dict(environ)
    self.hosts = tuple(hosts)  # The planned hosts; empty: this host.
    # Where an attempt's files (mpirun's hostfile) go: the private
    # directory the job makes for a launch (job.Job.make_files_dir); a dry
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
            ports: Mapping[str, Sequence[int]]) -> preflight.Report:
    """Which of `hosts` can run workers now (default: all of them, asking
    nothing)."""
    del want, ports
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
    (mpirun's account of a lost rank or host, srun's of a lost node)."""
    return plan.argv[0] in ('mpirun', 'srun')

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
    config = launch.tf_config_from_env(0, total_workers, self.environ)
    config['task']['index'] = 'RANK'
    return [f'TF_CONFIG of each rank: {json.dumps(config)}'] + [
        f'TF_CONFIG rank {rank}: task index {rank}, listens on {address}'
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

