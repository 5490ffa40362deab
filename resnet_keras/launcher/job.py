"""A training job across its attempts: the hosts each attempt runs on (all
of them, or with --min_hosts those that pass a new check: host_checks.py),
the global batch split on them (elastic.py), the trainer's command
line, where each restart resumes, and whether a dropped host may rejoin
(regrowth.py). The supervisor (supervisor.py) runs the attempts; the
placement (placement.py) checks hosts and starts workers.
"""

import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from absl import logging

from common import worker_contract
from common.batch_rule import BatchRule
from common.errors import UsageError
from resnet_keras.rundir import ownership
from resnet_keras.config import recipes
from resnet_keras.rundir import run_directory
from resnet_keras.rundir import run_lock
from resnet_keras.config import RunConfig
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import elastic
from resnet_keras.launcher import host_checks
from resnet_keras.launcher import launch_config
from resnet_keras.launcher import failures
from resnet_keras.launcher import membership
from resnet_keras.launcher import regrowth
from resnet_keras.launcher.placement import FILES_DIR_PREFIX, TRAINER, Placement


def uses_several_workers(cfg: RunConfig) -> bool:
  return cfg.use_horovod or cfg.distribution_strategy == 'multi_worker_mirrored'


def check_workers(cfg: RunConfig, total_workers: int) -> None:
  """That the trainer's settings can run on `total_workers` workers."""
  if total_workers > 1 and not uses_several_workers(cfg):
    raise UsageError(
        f'{total_workers} workers need a multi-worker backend: add '
        '--use_horovod or --distribution_strategy=multi_worker_mirrored')
  BatchRule(total_workers, cfg.use_horovod).check(cfg.batch_size)


def trainer_command(argv: Sequence[str], cfg: RunConfig,
                    filled: Dict[str, object], total_workers: int,
                    layout: Optional[elastic.Layout] = None) -> List[str]:
  """The trainer's argv: the launcher's command line less its own flags,
  then the settings a recipe or preset filled in; `layout`: an elastic
  job's batch split, when it is not the command line's."""
  check_workers(cfg, total_workers)
  forwarded = launch_config.strip(argv[1:])
  if layout:
    forwarded = launch.strip_flags(forwarded, (), elastic.BATCH_FLAGS)
    filled = {k: v for k, v in filled.items() if k not in elastic.BATCH_FLAGS}
    forwarded += layout.trainer_flags(cfg.use_horovod)
  return [sys.executable, TRAINER] + forwarded + recipes.as_args(filled)


class AttemptFiles:
  """The private directory of the attempts' files (mpirun's hostfile),
  made once and told to the placement: a shared /tmp gets no name another
  user could guess and plant a link at (tempfile.mkdtemp: a new name, mode
  0700)."""

  def __init__(self, placement: Placement):
    self._placement = placement
    self._dir: Optional[str] = None

  def make(self) -> None:
    if self._dir is None:
      self._dir = tempfile.mkdtemp(prefix=FILES_DIR_PREFIX)
      self._placement.files_dir = self._dir

  def remove(self) -> None:
    """Removes the files and their directory, once the job has ended,
    however it ended."""
    if self._dir is not None:
      shutil.rmtree(self._dir, ignore_errors=True)
      self._dir = None


class Job:
  """What each attempt of the job runs; `replan` is the supervisor's
  between attempts. It also restarts the lost tf.data service servers of
  `data_servers`."""

  def __init__(self, placement: Placement, cfg: RunConfig, argv,
               filled: Dict[str, object], servers):
    self.placement, self._cfg, self._argv = placement, cfg, argv
    launch_cfg = placement.cfg
    hosts = placement.hosts
    self.min_hosts = elastic.min_hosts(launch_cfg.min_hosts, hosts,
                                       placement.hosts_source)
    self.planned = elastic.planned_layout(
        hosts, launch_cfg.num_workers_per_hls, cfg.batch_size,
        cfg.num_accumulation_steps, cfg.use_horovod)
    if self.is_elastic:
      elastic.check_host_counts(self.planned, self.min_hosts,
                                launch_cfg.num_workers_per_hls,
                                launch_cfg.elastic_batch)
    self.layout = self.planned
    self.membership = membership.Membership(
        launch_cfg.max_membership_changes_per_hour)
    self._filled, self._servers = filled, servers
    self._started = time.time()
    self.data_servers = None  # DataServers, once started.
    self.files = AttemptFiles(placement)
    self.host_checks = host_checks.HostChecks(placement, cfg, servers,
                                              self.min_hosts)
    self._report = None  # The last pre-flight check's preflight.Report.

  @property
  def is_elastic(self) -> bool:
    return self.min_hosts < len(self.placement.hosts)

  def command(self, layout: Optional[elastic.Layout] = None,
              hosts_per_machine: int = 1) -> launch.Launch:
    """The command of an attempt on `layout`'s hosts (None: the planned
    ones), as data."""
    launch_cfg, hosts = self.placement.cfg, self.placement.hosts
    trainer_argv = trainer_command(
        self._argv, self._cfg, self._filled, self.placement.total_workers,
        layout)
    extra_env = {}
    if layout:
      hosts = list(layout.hosts)
      extra_env.update(worker_contract.hosts_env(hosts))
    if self.placement.workers_on(hosts) > 1:
      extra_env.update(worker_contract.failure_env(
          launch_cfg.failure_timeout, self._cfg.use_horovod))
    if launch_cfg.horovod_hierarchical_allreduce:
      extra_env.update(worker_contract.hierarchical_allreduce_env())
    return self.placement.command(trainer_argv, hosts, extra_env,
                                  hosts_per_machine)

  def first_attempt(self) -> failures.Attempt:
    if not self._cfg.model_dir and self.placement.total_workers > 1:
      # Each worker would otherwise make a private directory of its own.
      raise UsageError('a job of several workers needs --model_dir: name a '
                       'directory on storage every host shares')
    # --clean applies to the job's first attempt only: it starts from step
    # 0. A job the scheduler requeued resumes, whatever its script says.
    requeues = worker_contract.requeues(self.placement.environ)
    cleans = self._cfg.clean and not requeues
    if self._cfg.model_dir:  # One writer: another job's stops this one here.
      run_lock.check_free(self._cfg.model_dir, self.placement.environ)
    if cleans:
      # The trainer's chief cleans; a model_dir it would refuse to clean
      # stops the job here, before any host is contacted.
      ownership.check_cleanable(self._cfg.model_dir)
    self._report, _ = self.host_checks.run()
    step = None if cleans else self.saved_step()
    if requeues:
      logging.error('requeued %d time(s) by the scheduler: %s', requeues,
                    elastic.resuming(step))
    return self._attempt(step, lost=0.0)

  def saved_step(self) -> Optional[int]:
    """The step of model_dir's last checkpoint (None: none)."""
    latest = run_directory.latest_checkpoint(self._cfg.model_dir)
    return latest and latest.step

  @property
  def grows_back(self) -> bool:
    """Whether a dropped host may rejoin without a failure."""
    return self.is_elastic and self.membership.cap > 0

  def returning_hosts(self) -> Optional[str]:
    """regrowth.returning, for the hosts of this attempt."""
    _, want, ports = self.host_checks.checks()[0]
    check = lambda hosts, limit: self.placement.check(hosts, want, ports, limit)
    return regrowth.returning(self.planned.hosts, self.layout.hosts,
                              self.membership, check, time.monotonic())

  def replan(self, failure: Optional[failures.Failure]) -> failures.Attempt:
    """The next attempt: on the hosts that pass a new check (an elastic job,
    or one with a tf.data service; the same hosts otherwise), resuming at
    model_dir's last checkpoint, which the trainer is told to expect.
    `failure`: what ended the attempt before (None: it stopped for the job
    to grow back)."""
    del failure  # Every host is checked again, whatever failed.
    if self.is_elastic or self._servers or self.placement.checks_at_restart:
      self._check_again()
    latest = run_directory.latest_checkpoint(self._cfg.model_dir)
    since = latest.written if latest else self._started
    return self._attempt(latest and latest.step, time.time() - since,
                         restart=True)

  def _check_again(self) -> None:
    try:
      self._report, service = self.host_checks.run(restart=True)
      if self.data_servers:
        for line in self.data_servers.renew(service.ready):
          logging.error(line)
        self._filled['tf_data_service_workers'] = (
            self.data_servers.num_workers)
    except UsageError as e:
      raise UsageError(f'{e}; the job ends (resume it with the same command '
                       'once enough hosts are back)') from None

  def _attempt(self, step: Optional[int], lost: float,
               restart: bool = False) -> failures.Attempt:
    before, report = self.layout, self._report
    launch_cfg = self.placement.cfg
    layout = (elastic.relayout(self.planned, report.ready,
                               launch_cfg.num_workers_per_hls,
                               launch_cfg.elastic_batch)
              if self.is_elastic else self.planned)
    if layout.hosts != before.hosts:
      logging.error(elastic.describe_change(before, layout, step, lost))
      self.membership.changed(before.hosts, layout.hosts, time.monotonic())
    elif restart:
      logging.error('the job restarts on the same host(s): %s; %.0f s lost',
                    elastic.resuming(step), lost)
    self.layout = layout
    self._started = time.time()
    self.files.make()
    plan = self.command(layout if layout != self.planned else None,
                        report.hosts_per_machine)
    for note in plan.notes:
      print(f'note: {note}')
    for path, content in plan.files.items():
      with open(path, 'w') as f:  # In the job's own directory.
        f.write(content)
    sys.stdout.flush()
    return failures.Attempt(plan.argv,
                              {**self.placement.environ, **plan.env},
                              layout.hosts,
                              resume_step=(step or 0) if restart else None)
