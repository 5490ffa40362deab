"""The hosts a job checks before each attempt: training's, through its
placement (ssh hosts are asked over ssh; the others are ready), and the
tf.data service's, over ssh. Each problem is one line naming the host and
what to fix (preflight.py)."""

import sys
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging

from common import worker_contract
from common.errors import UsageError
from resnet_keras.config import RunConfig
from resnet_keras.launcher import preflight
from resnet_keras.launcher import ssh_hosts
from resnet_keras.launcher.placement import TRAINER, Placement

# (hosts, what they must have, ports that must be free on each).
Check = Tuple[Sequence[str], preflight.Expected, Dict[str, List[int]]]


class HostChecks:
  """A job's checks: of `placement`'s hosts for the trainer `cfg`, and of
  the tf.data service's `servers`; an elastic job (`min_hosts` fewer than
  the hosts) goes on without the training hosts that fail."""

  def __init__(self, placement: Placement, cfg: RunConfig, servers,
               min_hosts: int):
    self.placement, self._cfg = placement, cfg
    self._servers, self._min_hosts = servers, min_hosts

  def checks(self) -> Tuple[Optional[Check], Optional[Check]]:
    """(training's check, the data service's check), or None where
    nothing is checked."""
    training = service = None
    placement = self.placement
    if placement.hosts:
      ports = {}
      if (placement.asks_hosts and
          self._cfg.distribution_strategy == 'multi_worker_mirrored'):
        tf_config = worker_contract.tf_config_from_env(0, placement.total_workers,
                                              placement.environ)
        ports = preflight.ports_by_host(tf_config['cluster']['worker'])
      training = (placement.hosts,
                  preflight.expected(TRAINER, self._cfg.use_horovod), ports)
    if self._servers:
      ports = {}
      for server in self._servers:
        ports.setdefault(server.host, []).append(server.port)
      service = (list(ports), preflight.expected(TRAINER, False), ports)
    return training, service

  def lines(self) -> List[str]:
    """The checks, as --dry_run prints them."""
    training, service = self.checks()
    lines = []
    if training:
      lines += self.placement.check_lines(training[1], training[2])
    if service:
      lines += preflight.describe(service[0],
                                  ssh_hosts.ssh(self.placement.environ)[0],
                                  service[1], service[2])
    return lines

  def run(self, restart: bool = False):
    """Hosts (training's and the data service's) are checked before
    anything starts on them. Fail-stop (min_hosts = all hosts): every
    training host must be ready. Elastic: training hosts that fail are left
    out, each named in one line, as long as `min_hosts` remain. Data service
    hosts must all be ready at the start; at a `restart` those that fail
    are named and DataServers.renew leaves them out. Returns the reports of
    the training hosts and of the data service's (None without one)."""
    training_check, service_check = checks = self.checks()
    hosts = self.placement.hosts
    training = (self.placement.check(*training_check) if training_check else
                preflight.Report([], 1, tuple(hosts)))
    service = None
    if service_check:
      ssh, port = ssh_hosts.ssh(self.placement.environ)
      service_hosts, want, ports = service_check
      service = preflight.check(service_hosts, ssh, want, ports, port)
    fatal = []
    if service and restart:
      for line in service.problems:
        logging.error('%s', line)
    elif service:
      fatal += service.problems
    if self._min_hosts < len(hosts):
      for line in training.problems:
        logging.error('%s: left out of the job', line)
      if len(training.ready) < self._min_hosts:
        raise UsageError(
            f'only {len(training.ready)} of {len(hosts)} hosts pass the '
            f'pre-flight check ({", ".join(training.ready) or "none"}), '
            f'fewer than --min_hosts={self._min_hosts}')
    else:
      fatal = training.problems + fatal
    if fatal:
      for problem in fatal:
        print(f'error: {problem}', file=sys.stderr)
      every = sorted({h for check in checks if check for h in check[0]})
      raise UsageError(f'pre-flight check failed on {len(every)} host(s) '
                       f'({", ".join(every)})' +
                       ('' if restart else ': nothing was started'))
    return training, service

