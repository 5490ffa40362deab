"""Workers on the hosts of MULTI_HLS_IPS, started by mpirun over ssh
(DOCKER_SSHD_PORT) from a hostfile; each host is checked over the same ssh
before anything starts there (preflight.py: the same Python,
TensorFlow, Horovod and project path, the TF_CONFIG ports free)."""

from typing import Dict, List, Mapping, Sequence

from common import worker_contract
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import preflight
from resnet_keras.launcher import placement
from resnet_keras.launcher.launch_config import LaunchConfig


def ssh(environ: Mapping[str, str], timeout: int = preflight.SSH_TIMEOUT):
  """(ssh argv, its port) as mpirun and the data service hosts use it."""
  port = launch.ssh_port(environ)
  return preflight.ssh_command(environ, port, timeout), port


class SshHosts(placement.Placement):

  asks_hosts = True
  guard_kind = 'ssh_hosts'

  @classmethod
  def chosen(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str]) -> bool:
    del cfg, environ
    return bool(hosts)

  @classmethod
  def create(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str], use_horovod: bool) -> 'SshHosts':
    worker_contract.check_distinct(hosts, worker_contract.HOSTS_VAR)
    return super().create(cfg, environ, hosts, use_horovod)

  def check(self, hosts: Sequence[str], want: preflight.Expected,
            ports: Mapping[str, Sequence[int]],
            timeout: int = preflight.SSH_TIMEOUT) -> preflight.Report:
    argv, port = ssh(self.environ, timeout)
    return preflight.check(hosts, argv, want, ports, port, timeout)

  def check_lines(self, want: preflight.Expected,
                  ports: Mapping[str, Sequence[int]]) -> List[str]:
    return preflight.describe(self.hosts, ssh(self.environ)[0], want, ports)

  def command(self, trainer_argv: Sequence[str], hosts: Sequence[str],
              extra_env: Dict[str, str],
              hosts_per_machine: int) -> launch.Launch:
    return self._one_process_or_mpirun(trainer_argv, hosts, extra_env,
                                       hosts_per_machine)
