"""The port guard: the job's servers closed to every address but its hosts'.

TensorFlow's gRPC servers (multi_worker_mirrored's, at TF_BASE_PORT + local
rank; the tf.data service's dispatcher and data workers) listen on every
interface (TensorFlow 2.20 hard-codes 0.0.0.0, which gRPC widens to IPv6)
and run whatever a client sends them, without authentication; OpenMPI's
daemons (mpirun, orted) listen on every interface too. TensorFlow offers no
bind address, so as root the launcher adds, on each host of the job, an
iptables (and ip6tables) chain of its own that lets the job's hosts and
loopback through to those ports and resets everyone else's connections,
and removes it when the job ends (also after a failure or a signal).
OpenMPI's daemons are pinned to ports the chain covers (`mpi_env`).

Per placement: this host: the rules here; ssh hosts: on each host over the
launcher's ssh; Slurm and Kubernetes: none (docs/security.md says what
applies there). The allowed traffic RETURNs to the host's own rules rather
than being ACCEPTed: the guard only closes, never opens what a firewall
closes.
"""

import contextlib
import dataclasses
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import subprocess
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from absl import logging

from common import hosts as hosts_lib
from common.errors import UsageError
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import fanout

MODES = ('auto', 'on', 'off')
IPV4, IPV6 = 'iptables', 'ip6tables'
# While the guard is on, OpenMPI listens on the MPI_PORTS from
# TF_BASE_PORT + MPI_OFFSET: its daemons on the first _OOB_PORTS (mpirun
# takes every free one of them), each rank's TCP transport on one of the
# rest.
MPI_OFFSET, MPI_PORTS, _OOB_PORTS = 100, 68, 4
THIS_HOST = ''  # The host the launcher runs on, reached without ssh.
_TIMEOUT = 30  # Seconds for one host's rules, ssh included.
# Seconds to remove them: a host the job lost would hold its end up for
# ssh's whole ConnectTimeout.
_REMOVE_TIMEOUT = 6
_CANNOT = 3  # The script's exit code where the host cannot take rules.
_DOCS = 'docs/security.md'


@dataclasses.dataclass(frozen=True)
class Rules:
  """One host's rules: `ports` (inclusive ranges) closed to all but
  `sources` (addresses) and loopback, in the job's own `chain`."""
  chain: str
  sources: Tuple[str, ...]
  ports: Tuple[Tuple[int, int], ...]


def chain_name(token: Optional[str] = None) -> str:
  """A chain named after this launch (its pid and a random token), so that
  removing it removes only its rules; within iptables' 28 characters."""
  return f'RESNET_KERAS_{os.getpid()}_{token or secrets.token_hex(3)}'[:28]


def port_ranges(ports: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
  """`ports` as sorted inclusive ranges of consecutive ports."""
  ranges: List[List[int]] = []
  for port in sorted(set(ports)):
    if ranges and port == ranges[-1][1] + 1:
      ranges[-1][1] = port
    else:
      ranges.append([port, port])
  return tuple((low, high) for low, high in ranges)


def describe_ports(ports: Sequence[int]) -> str:
  return ', '.join(str(low) if low == high else f'{low}-{high}'
                   for low, high in port_ranges(ports))


def _jumps(rules: Rules, tool: str, action: str) -> List[List[str]]:
  return [[tool, '-w', action, 'INPUT', '-p', 'tcp', '--dport',
           f'{low}:{high}', '-j', rules.chain] for low, high in rules.ports]


def add_commands(rules: Rules, tool: str) -> List[List[str]]:
  """The commands that close `rules.ports` with `tool` (IPV4 or IPV6)."""
  version = 4 if tool == IPV4 else 6
  chain = rules.chain
  commands = [[tool, '-w', '-N', chain],
              [tool, '-w', '-A', chain, '-i', 'lo', '-j', 'RETURN']]
  commands += [[tool, '-w', '-A', chain, '-s', source, '-j', 'RETURN']
               for source in rules.sources
               if ipaddress.ip_address(source).version == version]
  commands.append([tool, '-w', '-A', chain, '-p', 'tcp', '-j', 'REJECT',
                   '--reject-with', 'tcp-reset'])
  return commands + _jumps(rules, tool, '-I')


def remove_commands(rules: Rules, tool: str) -> List[List[str]]:
  """The commands that remove exactly what add_commands added."""
  return _jumps(rules, tool, '-D') + [[tool, '-w', '-F', rules.chain],
                                      [tool, '-w', '-X', rules.chain]]


def remove_script(rules: Rules) -> str:
  """One shell command that removes a host's rules, whatever is left."""
  # Each command on its own: one already gone must not keep the others.
  return ' '.join(f'{shlex.join(c)} 2>/dev/null;' for tool in (IPV4, IPV6)
                  for c in remove_commands(rules, tool)) + ' true'


def add_script(rules: Rules) -> str:
  """One shell command for a host: that it can (root, iptables, and
  ip6tables where the kernel has IPv6, which the servers listen on too),
  the rules, or none and why not."""
  add4, add6 = (' && '.join(shlex.join(c) for c in add_commands(rules, tool))
                for tool in (IPV4, IPV6))
  return (f'[ "$(id -u)" = 0 ] || {{ echo not root; exit {_CANNOT}; }}; '
          f'command -v {IPV4} >/dev/null || '
          f'{{ echo no {IPV4}; exit {_CANNOT}; }}; '
          f'[ ! -e /proc/net/if_inet6 ] || command -v {IPV6} >/dev/null || '
          f'{{ echo no {IPV6}; exit {_CANNOT}; }}; '
          f'{{ {add4} && {{ [ ! -e /proc/net/if_inet6 ] || {{ {add6}; }}; }}; }}'
          f' || {{ {remove_script(rules)}; exit 4; }}')


def cannot(mode: str, placement: str, is_root: bool,
           has_iptables: bool) -> str:
  """Why --port_guard=`mode` adds no rules for a placement of kind
  `placement` ('this_host', 'ssh_hosts', 'slurm', 'kubernetes'), as this
  process sees it ('': it tries; ssh hosts say for themselves)."""
  if mode == 'off':
    return 'off (--port_guard=off)'
  if placement == 'slurm':
    return ('not applied under Slurm (it cannot remove rules from the nodes '
            'Slurm takes back)')
  if placement == 'kubernetes':
    return 'not applied under Kubernetes (give the pods a NetworkPolicy)'
  if placement == 'this_host' and not is_root:
    return 'not applied (not root)'
  if placement == 'this_host' and not has_iptables:
    return 'not applied (no iptables on this host)'
  return ''


def job_ports(hosts: Sequence[str], tf_ports: Sequence[int],
              mpi: Optional[Tuple[int, int]],
              servers: Sequence[launch.DataServer]
              ) -> Dict[str, List[int]]:
  """host -> the job's ports there: the training hosts' (THIS_HOST where
  there are none) TensorFlow and OpenMPI ports, the data servers'."""
  mpi_ports = list(range(mpi[0], mpi[1] + 1)) if mpi else []
  by_host = {host: list(tf_ports) + mpi_ports
             for host in (hosts or [THIS_HOST]) if tf_ports or mpi_ports}
  for server in servers:
    by_host.setdefault(server.host, []).append(server.port)
  return by_host


def mpi_range(base_port: int) -> Tuple[int, int]:
  low = base_port + MPI_OFFSET
  return low, low + MPI_PORTS - 1


def mpi_env(ports: Tuple[int, int]) -> Dict[str, str]:
  """OpenMPI's daemons (IPv4 and IPv6) and TCP transport within `ports`
  (mpirun passes its MCA variables on to the remote daemons)."""
  low, high = ports
  daemons = f'{low}-{low + _OOB_PORTS - 1}'
  return {'OMPI_MCA_oob_tcp_dynamic_ipv4_ports': daemons,
          'OMPI_MCA_oob_tcp_dynamic_ipv6_ports': daemons,
          'OMPI_MCA_btl_tcp_port_min_v4': str(low + _OOB_PORTS),
          'OMPI_MCA_btl_tcp_port_range_v4': str(high - low + 1 - _OOB_PORTS)}


def resolve(hosts: Sequence[str]) -> Tuple[str, ...]:
  """The addresses of `hosts` (names or addresses), of each family."""
  addresses = []
  for host in hosts:
    try:
      infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
      raise UsageError(f'host {host}: no address found ({e.strerror}): fix '
                       'MULTI_HLS_IPS or --data_service_hosts') from None
    addresses += [info[4][0] for info in infos]
  return tuple(dict.fromkeys(addresses))


class Guard:
  """The rules of one job: `ports_by_host` (host -> ports; THIS_HOST: here)
  closed to all but `sources` and loopback. `ssh`: the argv that runs a
  command on a host (the host and the command appended)."""

  def __init__(self, ports_by_host: Mapping[str, Sequence[int]],
               sources: Sequence[str], ssh: Sequence[str],
               chain: Optional[str] = None):
    self.chain = chain or chain_name()
    self.rules = {host: Rules(self.chain, tuple(sources), port_ranges(ports))
                  for host, ports in ports_by_host.items()}
    self.ports = sorted({p for ports in ports_by_host.values() for p in ports})
    self._ssh = list(ssh)
    self.applied: List[str] = []

  def argv(self, host: str, script: str) -> List[str]:
    return ['sh', '-c', script] if host == THIS_HOST else (
        self._ssh + ['--', host, script])

  def _run(self, host: str, script: str,
           timeout: float = _TIMEOUT) -> Optional[str]:
    """None once `script` ran on `host`; otherwise why not, in a few words."""
    try:
      done = subprocess.run(self.argv(host, script), capture_output=True,
                            text=True, stdin=subprocess.DEVNULL,
                            timeout=timeout)
    except subprocess.TimeoutExpired:
      return f'no answer within {timeout:.0f} s'
    except OSError as e:
      return e.strerror
    said = ' '.join((done.stdout + done.stderr).split())
    return None if done.returncode == 0 else (said[-160:] or
                                              f'exit {done.returncode}')

  def _each(self, hosts: Sequence[str], script_of,
            timeout: float = _TIMEOUT) -> Dict[str, Optional[str]]:
    return dict(zip(hosts, fanout.each_host(
        hosts,
        lambda host: self._run(host, script_of(self.rules[host]), timeout))))

  def add(self) -> Dict[str, str]:
    """Adds every host's rules; returns the hosts where it could not, and
    why."""
    results = self._each(list(self.rules), add_script)
    self.applied = [host for host, why in results.items() if why is None]
    return {host: why for host, why in results.items() if why is not None}

  def remove(self) -> List[str]:
    """Removes the rules from every host they were added on; a line for
    each host where that failed."""
    failed = self._each(self.applied, remove_script, _REMOVE_TIMEOUT)
    self.applied = []
    return [f'port guard: could not remove iptables chain {self.chain} on '
            f'{host or "this host"} ({why}): remove it there ({_DOCS})'
            for host, why in failed.items() if why]

  def lines(self) -> List[str]:
    """What it runs on each host, as --dry_run prints it: once for the
    hosts that get the same rules, HOST standing for each (one line per
    host listed every host's address in each: 55 MB at 1,000 hosts)."""
    hosts_of: Dict[Rules, List[str]] = {}
    for host, rules in self.rules.items():
      hosts_of.setdefault(rules, []).append(host)
    lines = []
    for rules, hosts in hosts_of.items():
      if len(hosts) == 1 or THIS_HOST in hosts:
        lines += [f'port guard on {_name(host)}: '
                  f'{shlex.join(self.argv(host, add_script(rules)))}'
                  for host in hosts]
      else:
        lines.append(f'port guard on each of {", ".join(hosts)}: '
                     f'{shlex.join(self.argv("HOST", add_script(rules)))}')
    return lines


def _name(host: str) -> str:
  return host or 'this host'


def outcome(guard: Guard, failed: Mapping[str, str],
            mode: str) -> Tuple[str, bool]:
  """The launcher's one line about the rules just added (`failed`: the
  hosts where they could not be, and why), and whether every host has
  them; --port_guard=on with a failure: UsageError (the caller removes what
  was added)."""
  if failed and mode == 'on':
    host, why = next(iter(failed.items()))
    raise UsageError(f'--port_guard=on: cannot close the job\'s ports on '
                     f'{_name(host)} ({why}); nothing was started: run as '
                     'root with iptables on every host, or use '
                     '--port_guard=auto')
  open_ = '; '.join(f'{_name(h)}: {why}' for h, why in failed.items())
  if not guard.applied:
    return not_applied(f'not applied ({open_})', guard.ports), False
  closed_on = ', '.join(_name(h) for h in guard.applied)
  return (f'port guard: ports {describe_ports(guard.ports)} closed to all '
          f'but the job\'s hosts and loopback on {closed_on} (iptables chain '
          f'{guard.chain}, removed at the end; --port_guard=off leaves them '
          'open)' + (f'; NOT on {open_}' if failed else ''), not failed)


def not_applied(why: str, ports: Sequence[int]) -> str:
  """The launcher's one line where it adds no rules (`why`: `cannot`)."""
  return (f'port guard: {why}: ports {describe_ports(ports)} listen on every '
          'interface without authentication; run on a private network '
          f'({_DOCS})')


def _stop_on_sigterm(signum, frame):  # pylint: disable=unused-argument
  raise SystemExit(128 + signum)


@contextlib.contextmanager
def closed(guard: Optional[Guard], mode: str) -> Iterator[None]:
  """The job's ports closed by `guard` (None: nothing to close) inside,
  said in one line. Removed on every way out: a return, an exception,
  SIGINT, or SIGTERM (outside the supervisor, which forwards it to the job,
  it ends the launch through this `finally`)."""
  if guard is None:
    yield
    return
  previous = {sig: signal.getsignal(sig)
              for sig in (signal.SIGTERM, signal.SIGINT)}
  signal.signal(signal.SIGTERM, _stop_on_sigterm)
  try:
    line, complete = outcome(guard, guard.add(), mode)
    (logging.info if complete else logging.warning)('%s', line)
    yield
  finally:
    # The rules go even if the user presses Ctrl-C again meanwhile.
    for sig in previous:
      signal.signal(sig, signal.SIG_IGN)
    try:
      for line in guard.remove():
        logging.error('%s', line)
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


def for_job(mode: str, placement: str, hosts: Sequence[str],
            tf_ports: Sequence[int], mpi: Optional[Tuple[int, int]],
            servers: Sequence[launch.DataServer], ssh: Sequence[str],
            is_root: bool, has_iptables: bool
            ) -> Tuple[Optional[Guard], str]:
  """The guard of a job (None: none) and, without one, the launcher's line
  saying why ('': nothing of the job listens). `hosts`: the training hosts
  (none: this host); `tf_ports`: multi_worker_mirrored's on each; `mpi`:
  OpenMPI's range where mpirun starts the workers."""
  ports_by_host = job_ports(hosts, tf_ports, mpi, servers)
  if not ports_by_host:
    return None, ''
  why = cannot(mode, placement, is_root, has_iptables)
  every = [p for ports in ports_by_host.values() for p in ports]
  if why and mode == 'on':
    raise UsageError(f'--port_guard=on: {why}: run where it can '
                     f'({_DOCS}), or use --port_guard=auto')
  if why:
    return None, not_applied(why, every)
  named = [h for h in ports_by_host if h != THIS_HOST] + list(hosts)
  sources = resolve(list(dict.fromkeys(named)))
  if named:  # The launcher's own address, which mpirun's daemons call.
    try:
      sources += (hosts_lib.address_toward(named[0]),)
    except OSError as e:
      raise UsageError(f'host {named[0]}: no route to it from this host '
                       f'({e.strerror or e}): fix MULTI_HLS_IPS or '
                       '--data_service_hosts, or the network') from None
  return Guard(ports_by_host, tuple(dict.fromkeys(sources)), ssh), ''
