"""The launcher as a library: `launch` is demo_resnet_keras.py's main.

Parsed flags -> the trainer's settings a recipe (--config) and the
optimizer preset fill in -> LaunchConfig and RunConfig -> the placement
(how workers start) -> the Job -> --print_config, --dry_run, or the
supervised attempts with the tf.data service's servers around them.
A scheduler's placement may print its batch script instead (--dry_run
outside its allocation), once the flags are checked for the workers the
script asks for (registry.batch_script_of).
"""

import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from typing import Dict, List, Mapping, Optional, Sequence, Type

from absl import flags
from absl import logging

from common import cli
from common import worker_contract
from common.errors import STOPPED_AT_WARNING_EXIT_CODE, UsageError
from resnet_keras.config import flags as flags_lib
from resnet_keras.config import recipes
from resnet_keras.config import RunConfig
from resnet_keras.launcher import commands as launch_lib
from resnet_keras.launcher import elastic
from resnet_keras.launcher import input_servers
from resnet_keras.launcher import job as job_lib
from resnet_keras.launcher import launch_config
from resnet_keras.launcher import port_guard
from resnet_keras.launcher import preflight
from resnet_keras.launcher import presets
from resnet_keras.launcher import ssh_hosts
from resnet_keras.launcher import supervisor
from resnet_keras.launcher.launch_config import LaunchConfig
from resnet_keras.launcher.placement import Placement
from resnet_keras.launcher import registry


def apply_preset(values: flags.FlagValues, recipe: Dict[str, object],
                 total_workers: int) -> Dict[str, object]:
  """Applies the optimizer preset for a job of `total_workers` to `values`
  where neither the command line nor `recipe` (what --config filled in)
  gave a value, in any spelling; returns the trainer settings the two
  filled in."""
  preset = recipes.apply(
      values, presets.preset(values.optimizer, total_workers),
      f'--optimizer={values.optimizer} preset', flags_lib.RUN_CONFIG_KEYS,
      skip=recipe)
  return {name: value for name, value in {**recipe, **preset}.items()
          if name not in launch_config.RECIPE_KEYS}


def data_service_servers(cfg: LaunchConfig, environ: Mapping[str, str]
                         ) -> List[launch_lib.DataServer]:
  """The tf.data service servers --data_service_hosts asks for."""
  if not cfg.data_service_hosts:
    return []
  # A journal of this launch's own: no other job's dispatcher resumes from
  # it, and no one can plant it beforehand.
  work_dir = cfg.data_service_work_dir or os.path.join(
      tempfile.gettempdir(), f'resnet_keras_data_service_{uuid.uuid4().hex}')
  return launch_lib.data_service_servers(
      cfg.data_service_hosts, ssh_hosts.ssh(environ)[0], sys.executable,
      os.path.dirname(job_lib.TRAINER), cfg.data_service_port, work_dir)


def _point_at_data_service(values: flags.FlagValues, cfg: LaunchConfig,
                           filled: Dict[str, object]) -> None:
  """--data_service_hosts: the trainer's --tf_data_service is ours."""
  if values.tf_data_service:
    raise UsageError('--data_service_hosts starts a tf.data service and '
                     'points the trainer at it; --tf_data_service names '
                     'one started elsewhere: give one of them')
  settings = {'tf_data_service': launch_lib.data_service_address(
      cfg.data_service_hosts, cfg.data_service_port),
              'tf_data_service_workers': len(cfg.data_service_hosts)}
  for name, value in settings.items():
    values[name].value = filled[name] = value


def guard_for(job: job_lib.Job, cfg: RunConfig,
              servers: Sequence[launch_lib.DataServer],
              plan: launch_lib.Launch):
  """The port guard (port_guard.py; None: none) of the job that `plan`
  starts and, without one, the launcher's line saying why ('': nothing of
  the job listens). Where it guards mpirun's daemons, they are pinned to
  the ports it closes."""
  placement = job.placement
  workers = placement.total_workers
  by_host = preflight.ports_by_host(worker_contract.tf_config_from_env(
      0, workers, placement.environ)['cluster']['worker'])
  tf_ports = next(iter(by_host.values()))
  mpi = (port_guard.mpi_range(min(tf_ports))
         if plan.argv[0] == 'mpirun' else None)
  if cfg.distribution_strategy != 'multi_worker_mirrored' or workers == 1:
    tf_ports = []
  guard, line = port_guard.for_job(
      placement.cfg.port_guard, placement.guard_kind, placement.guard_refused,
      placement.hosts, tf_ports, mpi, servers,
      ssh_hosts.ssh(placement.environ)[0],
      os.geteuid() == 0, shutil.which('iptables') is not None)
  if guard and mpi:
    placement.environ.update(port_guard.mpi_env(mpi))
  return guard, line


def dry_run(job: job_lib.Job, cfg: RunConfig,
            servers: Sequence[launch_lib.DataServer],
            guard: Optional[port_guard.Guard]) -> None:
  """Prints what the launch would run and check, contacting nobody."""
  plan = job.command()
  for note in plan.notes:
    print(f'note: {note}')
  print(plan.describe())
  total_workers = job.placement.total_workers
  if cfg.distribution_strategy == 'multi_worker_mirrored' and total_workers > 1:
    print('\n'.join(job.placement.tf_configs(total_workers)))
  for server in servers:
    print(f'data service {server.role} on {server.host}: '
          f'{shlex.join(server.argv)}')
    print('  stopped at the end by the PID and start time it reports '
          f'as it starts: {shlex.join(server.stop_argv("PID", "START"))}')
  for line in job.host_checks.lines():
    print(line)
  if job.is_elastic:
    print('\n'.join(elastic.describe_layouts(
        job.planned, job.min_hosts, job.placement.cfg.num_workers_per_hls,
        job.placement.cfg.elastic_batch, cfg.use_horovod)))
  for line in guard.lines() if guard else []:
    print(line)


def print_batch_script(scheduler: Type[Placement], nodes: int,
                       argv: Sequence[str], values: flags.FlagValues,
                       recipe: Dict[str, object], cfg: LaunchConfig) -> None:
  """Prints `scheduler`'s batch script that makes the launch `argv`
  describes on `nodes` nodes. Its flags are checked here as the launch
  inside the allocation will check them, so that a bad one fails now rather
  than once the job is scheduled."""
  total_workers = nodes * cfg.num_workers_per_hls
  apply_preset(values, recipe, total_workers)
  job_lib.check_workers(flags_lib.config_from_flags(values), total_workers)
  cores = launch_lib.cores_per_worker(launch_lib.physical_core_count(),
                                      cfg.num_workers_per_hls)
  print(scheduler.batch_script(argv, recipe, cfg, nodes, max(1, cores),
                               sys.executable,
                               os.path.dirname(job_lib.TRAINER)), end='')


def _check_tools(plan: launch_lib.Launch, cfg: RunConfig) -> None:
  if plan.argv[0] == 'mpirun' and not shutil.which('mpirun'):
    cli.fail('mpirun not found; install OpenMPI (apt-get install openmpi-bin '
             'libopenmpi-dev, or run scripts/install_horovod.sh)')
  if cfg.use_horovod and importlib.util.find_spec('horovod') is None:
    cli.fail('--use_horovod needs Horovod; install it with '
             'scripts/install_horovod.sh')


def launch(argv: Sequence[str], values: flags.FlagValues,
           environ: Mapping[str, str]) -> int:
  """Launches the job `argv` (the launcher's command line, parsed into
  `values`) describes; its exit code (its last attempt's)."""
  environ = dict(environ)
  worker_contract.check_environment(environ)
  argv = launch_config.as_parsed(argv, values)
  recipe = flags_lib.apply_config(  # The launcher's recipe keys too.
      values, allowed=flags_lib.RUN_CONFIG_KEYS | set(launch_config.RECIPE_KEYS))
  launch_cfg = launch_config.from_flags(values)
  worker_contract.tf_base_port(environ, launch_cfg.num_workers_per_hls)
  batch = registry.batch_script_of(launch_cfg, environ)
  if batch:
    print_batch_script(*batch, argv, values, recipe, launch_cfg)
    return 0
  # The preset's learning rate depends on the workers the placement gives
  # (a scheduler's allocation, MULTI_HLS_IPS's hosts, this host).
  placement = registry.placement_for(launch_cfg, environ, values.use_horovod)
  filled = apply_preset(values, recipe, placement.total_workers)
  if launch_cfg.data_service_hosts:
    _point_at_data_service(values, launch_cfg, filled)
  servers = data_service_servers(launch_cfg, environ)
  cfg = flags_lib.config_from_flags(values)  # Bad trainer flags fail first.
  if values.print_config:
    print(recipes.dump(cfg, launch_config.recipe_values(launch_cfg)), end='')
    return 0
  job = job_lib.Job(placement, cfg, argv, filled, servers)
  plan = job.command()
  if not launch_cfg.dry_run:
    _check_tools(plan, cfg)
  guard, unguarded = guard_for(job, cfg, servers, plan)
  if placement.headline():
    logging.info('%s', placement.headline())
  if unguarded:
    logging.warning('%s', unguarded)
  if launch_cfg.dry_run:
    dry_run(job, cfg, servers, guard)
    return 0
  return run(job, launch_cfg, servers, placement.parses_output(plan), guard)


def run(job: job_lib.Job, cfg: LaunchConfig,
        servers: Sequence[launch_lib.DataServer], parse_output: bool,
        guard: Optional[port_guard.Guard]) -> int:
  """The job's attempts under the supervisor (`parse_output`: it reads
  their output to name a failure), once its hosts are checked, with its
  ports closed by `guard` and the tf.data service's servers running around
  them; the exit code of the last attempt. The launcher's files (the
  hostfile) go at the end, also after a failure of the first attempt."""
  try:
    attempt = job.first_attempt()
    with port_guard.closed(guard, cfg.port_guard):
      return _supervise(job, cfg, servers, parse_output, attempt)
  finally:
    job.files.remove()


def _supervise(job: job_lib.Job, cfg: LaunchConfig,
               servers: Sequence[launch_lib.DataServer], parse_output: bool,
               attempt) -> int:
  running = input_servers.DataServers(list(servers), logging.error)
  try:
    running.start()
    job.data_servers = running if servers else None
    exit_code = supervisor.Supervisor(
        attempt, max_restarts=cfg.max_restarts,
        workers_per_host=cfg.num_workers_per_hls,
        parse_output=parse_output,
        log=logging.error, replan=job.replan,
        abort_grace=cfg.failure_timeout,
        launcher_output=job.placement.launcher_output,
        regrowth_check=job.returning_hosts if job.grows_back else None
    ).run()
  finally:
    running.stop()
  if exit_code == STOPPED_AT_WARNING_EXIT_CODE:
    return job.placement.stopped_at_warning(job.saved_step())
  if exit_code and running.lost_hosts():
    logging.error('the tf.data service lost its servers on %s during the '
                  'job: restart them there (or drop them from '
                  '--data_service_hosts) and rerun to resume',
                  ', '.join(running.lost_hosts()))
  return exit_code
