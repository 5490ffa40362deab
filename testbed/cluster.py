"""A cluster of hosts on this machine, for the multi-host tests.

Each host is a Linux network namespace with its own address on a private
bridge, its own hostname (a UTS namespace) and an sshd on port 3022 that
takes one key, generated for the test session, for root. The bridge lives
in a namespace of its own (the "switch"), so the machine's own network
namespace holds nothing of the cluster but an `unreachable` route for its
subnet, added before anything else: no packet for a cluster address can
leave the machine through the default route. Nothing is written to the
user's ~/.ssh or /etc/ssh: ssh options come from a config file in the
cluster's state directory, given to OpenMPI as its rsh agent.

Failures are made as they happen on real networks: a link cut
(`cut_link`: the switch's end of the host's cable down), a black hole
(`black_hole`: link up, every packet dropped by iptables in the host), a
host whose processes all die (`kill_host_processes`). This kernel has no
`tc netem`.

Tear-down kills every process in the hosts' namespaces (all were started
through the fixture's sshds or `run`) and removes namespaces, bridge and
route, also when a test fails.
"""

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

SSH_PORT = 3022
_NAMESPACE_TOOLS = ('ip', 'sshd', 'ssh', 'ssh-keygen', 'nsenter', 'iptables')


@dataclasses.dataclass
class Host:
  name: str  # Network namespace and hostname.
  address: str
  bridge_port: str  # The switch's end of this host's veth pair.
  sshd: Optional[subprocess.Popen] = None


def missing_requirements() -> Optional[str]:
  """Why this machine cannot build a cluster at all, or None."""
  if os.geteuid() != 0:
    return 'network namespaces need root'
  return None


def _check_tools() -> None:
  missing = [tool for tool in _NAMESPACE_TOOLS
             if not shutil.which(tool) and
             not os.path.exists(f'/usr/sbin/{tool}')]
  if missing:
    raise RuntimeError('missing ' + ', '.join(missing) + ' (scripts/test.sh '
                       'installs iproute2, openssh-server, openssh-client, '
                       'iptables and util-linux)')


def link_flags_up(ip_link_line: str) -> bool:
  """Whether `ip -o link show`'s line has the administrative UP flag (the
  operational state, 'state UP', lags behind it)."""
  flags = re.search(r'<([^>]*)>', ip_link_line)
  return bool(flags) and 'UP' in flags.group(1).split(',')


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(argv, check=check, capture_output=True, text=True)


def _sshd_pid(state_dir: str, host: Host) -> int:
  with open(os.path.join(state_dir, f'sshd_{host.name}.pid')) as f:
    return int(f.read())


def _kill_namespace_processes(name: str, keep: Sequence[int] = ()) -> None:
  for pid in _sh('ip', 'netns', 'pids', name, check=False).stdout.split():
    if int(pid) in keep:
      continue
    try:
      os.kill(int(pid), signal.SIGKILL)
    except ProcessLookupError:
      pass


class HostAccess:
  """Commands on a cluster's hosts: entered as a user logged in there
  would be, over ssh from one host to another, started and found. Mixed
  into Cluster, whose `hosts`, `state_dir` and `ssh_config` it reads."""

  def enter(self, host: Host) -> List[str]:
    """argv prefix that runs a command on `host` (network, hostname; the
    hosts file too where the names resolve)."""
    return (['nsenter', '-t', str(_sshd_pid(self.state_dir, host)), '--net',
             '--uts'] + (['--mount'] if self.names_resolve else []))

  def ssh_argv(self, target: Host) -> List[str]:
    return ['ssh', '-F', self.ssh_config, target.address]

  def ssh(self, source: Host, target: Host, command: str,
          check: bool = True, timeout: float = 30
          ) -> subprocess.CompletedProcess:
    return subprocess.run(self.enter(source) + self.ssh_argv(target) +
                          [command], check=check, capture_output=True,
                          text=True, timeout=timeout)

  def launcher_env(self, environ: Dict[str, str]) -> Dict[str, str]:
    """What a user sets to launch on these hosts (README), plus this
    cluster's ssh options for OpenMPI."""
    return {**environ,
            'MULTI_HLS_IPS': ','.join(h.address for h in self.hosts),
            'MPI_TCP_INCLUDE': 'eth0', 'DOCKER_SSHD_PORT': str(SSH_PORT),
            'OMPI_MCA_plm_rsh_agent': f'ssh -F {self.ssh_config}'}

  def popen(self, host: Host, argv: Sequence[str], env: Dict[str, str],
            **kwargs) -> subprocess.Popen:
    """Starts `argv` on `host` (as a user logged in there would)."""
    return subprocess.Popen(self.enter(host) + list(argv), env=env, **kwargs)

  def processes(self, host: Host, pattern: str) -> List[int]:
    """PIDs of processes on `host` whose command line contains `pattern`."""
    found = []
    for pid in _sh('ip', 'netns', 'pids', host.name,
                   check=False).stdout.split():
      try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
          if pattern.encode() in f.read():
            found.append(int(pid))
      except OSError:
        pass
    return found


class FaultInjection:
  """Failures made as they happen on real networks (the module docstring
  lists them), and their repair. Mixed into Cluster, whose `switch` and
  `state_dir` it reads."""

  def cut_link(self, host: Host) -> None:
    _sh('ip', '-n', self.switch, 'link', 'set', host.bridge_port, 'down')

  def restore_link(self, host: Host) -> None:
    _sh('ip', '-n', self.switch, 'link', 'set', host.bridge_port, 'up')

  def link_up(self, host: Host) -> bool:
    """Whether `host`'s link is up, as the switch's end of it says (what
    cut_link sets down)."""
    return link_flags_up(_sh('ip', '-o', '-n', self.switch, 'link', 'show',
                             host.bridge_port).stdout)

  def black_hole(self, host: Host) -> None:
    for chain in ('INPUT', 'OUTPUT'):
      _sh('ip', 'netns', 'exec', host.name, 'iptables', '-A', chain,
          '-o' if chain == 'OUTPUT' else '-i', 'eth0', '-j', 'DROP')

  def clear_firewall(self, host: Host) -> None:
    """No rule and no chain of anyone's left, IPv4 and IPv6: a job's port
    guard cannot remove its chain from a host it lost."""
    for tool in ('iptables', 'ip6tables'):
      _sh('ip', 'netns', 'exec', host.name, tool, '-F')
      _sh('ip', 'netns', 'exec', host.name, tool, '-X')

  def kill_host_processes(self, host: Host) -> None:
    """Every process on `host` killed (sshd kept, to let a restart in)."""
    _kill_namespace_processes(
        host.name, keep=(_sshd_pid(self.state_dir, host), host.sshd.pid))


class Cluster(HostAccess, FaultInjection):
  """`num_hosts` hosts h1..hN at 10.77.S.1..N (S from `subnet_index`): built
  (`start`) and torn down (`stop`) here; used through HostAccess and broken
  through FaultInjection."""

  def __init__(self, num_hosts: int, state_dir: str, subnet_index: int,
               names_resolve: bool = False):
    self.prefix = f'rk{subnet_index}'
    self.subnet = f'10.77.{subnet_index}.0/24'
    self.switch = f'{self.prefix}sw'
    self.bridge = f'{self.prefix}br'
    self.state_dir = state_dir
    self.hosts = [Host(name=f'{self.prefix}h{i}',
                       address=f'10.77.{subnet_index}.{i}',
                       bridge_port=f'{self.prefix}h{i}b')
                  for i in range(1, num_hosts + 1)]
    self.ssh_config = os.path.join(state_dir, 'ssh_config')
    # Each host's name resolves to its address on every host: a hosts file
    # in the state directory, bind-mounted over /etc/hosts in a mount
    # namespace of the hosts' own (the machine's file is left alone). Gloo
    # (Horovod's elastic mode) finds its own address by its hostname.
    self.names_resolve = names_resolve
    self._hosts_file = os.path.join(state_dir, 'hosts')
    self._route_added = False

  def start(self) -> 'Cluster':
    try:
      self._build()
    except BaseException:
      self.stop()
      raise
    return self

  def _build(self) -> None:
    _check_tools()
    self.stop()  # Leftovers of an earlier session killed mid-way.
    _sh('ip', 'route', 'add', 'unreachable', self.subnet)
    self._route_added = True
    os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
    os.makedirs('/run/sshd', mode=0o755, exist_ok=True)  # sshd's privsep dir.
    self._write_keys()
    if self.names_resolve:
      with open(self._hosts_file, 'w') as f:
        f.write('127.0.0.1 localhost\n' + ''.join(
            f'{h.address} {h.name}\n' for h in self.hosts))
    _sh('ip', 'netns', 'add', self.switch)
    _sh('ip', '-n', self.switch, 'link', 'add', self.bridge, 'type', 'bridge')
    _sh('ip', '-n', self.switch, 'link', 'set', self.bridge, 'up')
    for host in self.hosts:
      _sh('ip', 'netns', 'add', host.name)
      _sh('ip', '-n', host.name, 'link', 'add', 'eth0', 'type', 'veth',
          'peer', 'name', host.bridge_port, 'netns', self.switch)
      _sh('ip', '-n', self.switch, 'link', 'set', host.bridge_port,
          'master', self.bridge, 'up')
      _sh('ip', '-n', host.name, 'addr', 'add', f'{host.address}/24',
          'dev', 'eth0')
      _sh('ip', '-n', host.name, 'link', 'set', 'eth0', 'up')
      _sh('ip', '-n', host.name, 'link', 'set', 'lo', 'up')
      self._start_sshd(host)
    for host in self.hosts:
      self.wait_for_ssh(host)

  def _write_keys(self) -> None:
    key = os.path.join(self.state_dir, 'id_ed25519')
    host_key = os.path.join(self.state_dir, 'ssh_host_ed25519_key')
    for path in (key, host_key):
      if not os.path.exists(path):
        _sh('ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', path)
    shutil.copy(key + '.pub', os.path.join(self.state_dir, 'authorized_keys'))
    with open(self.ssh_config, 'w') as f:
      f.write(f'Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n'
              '  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n'
              '  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 5\n'
              f'  Port {SSH_PORT}\n')

  def _start_sshd(self, host: Host) -> None:
    config = os.path.join(self.state_dir, f'sshd_{host.name}')
    with open(config, 'w') as f:
      f.write(f'Port {SSH_PORT}\nListenAddress {host.address}\n'
              f'HostKey {self.state_dir}/ssh_host_ed25519_key\n'
              f'PidFile {self.state_dir}/sshd_{host.name}.pid\n'
              f'AuthorizedKeysFile {self.state_dir}/authorized_keys\n'
              'PermitRootLogin prohibit-password\nPasswordAuthentication no\n'
              'KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n'
              'MaxStartups 100\nMaxSessions 100\n')
    # The hostname is set in a UTS namespace of the host's own, which every
    # process sshd starts (orted, the ranks) inherits.
    script = (f'hostname {host.name} && exec {shutil.which("sshd") or "/usr/sbin/sshd"} '
              f'-D -e -f {config}')
    namespaces = ['--uts']
    if self.names_resolve:
      # unshare makes the new mount namespace private: the bind mount is
      # seen by this host's processes only.
      script = f'mount --bind {self._hosts_file} /etc/hosts && {script}'
      namespaces.append('--mount')
    host.sshd = subprocess.Popen(
        ['ip', 'netns', 'exec', host.name, 'unshare'] + namespaces +
        ['sh', '-c', script], stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(self.state_dir, f'sshd_{host.name}.log'),
                    'w'))

  def wait_for_ssh(self, host: Host, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
      # On a busy machine sshd writes its pid file (which `enter` reads)
      # a while after it starts.
      if all(self._has_pid_file(h) for h in (self.hosts[0], host)):
        result = self.ssh(self.hosts[0], host, 'hostname', check=False)
        if result.returncode == 0 and result.stdout.strip() == host.name:
          return
        reason = result.stderr.strip()
      else:
        reason = 'no pid file yet'
      if host.sshd.poll() is not None:
        raise RuntimeError(f'sshd of {host.name} exited: see '
                           f'{self.state_dir}/sshd_{host.name}.log')
      if time.monotonic() > deadline:
        raise RuntimeError(f'sshd of {host.name} did not answer: {reason}')
      time.sleep(0.2)  # Polls for sshd to answer; not a guessed wait.

  def _has_pid_file(self, host: Host) -> bool:
    path = os.path.join(self.state_dir, f'sshd_{host.name}.pid')
    try:
      with open(path) as f:
        return f.read().strip().isdigit()
    except FileNotFoundError:
      return False

  def stop(self) -> None:
    for name in [h.name for h in self.hosts] + [self.switch]:
      _kill_namespace_processes(name)
      _sh('ip', 'netns', 'del', name, check=False)
    for host in self.hosts:
      if host.sshd is not None:
        host.sshd.wait(timeout=10)
        host.sshd = None
    # Deleting the switch namespace removed the bridge and every veth.
    if self._route_added or _sh('ip', 'route', 'show', 'type', 'unreachable',
                                self.subnet).stdout.strip():
      _sh('ip', 'route', 'del', 'unreachable', self.subnet, check=False)
      self._route_added = False
    shutil.rmtree(self.state_dir, ignore_errors=True)
