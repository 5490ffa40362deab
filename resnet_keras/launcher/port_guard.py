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
launcher's ssh; where a placement refuses them (its guard_refused: Slurm,
Kubernetes), none (docs/security.md says what applies there). The rules
themselves, as shell commands, are port_rules.py's.
"""

import contextlib
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
from resnet_keras.launcher import port_rules

MODES = ('auto', 'on', 'off')
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
_DOCS = 'docs/security.md'


def describe_ports(ports: Sequence[int]) -> str:
  return ', '.join(str(low) if low == high else f'{low}-{high}'
                   for low, high in port_rules.port_ranges(ports))


def cannot(mode: str, kind: str, refused: str, is_root: bool,
           has_iptables: bool) -> str:
  """Why --port_guard=`mode` adds no rules for a placement whose guard_kind
  is `kind` ('this_host', 'ssh_hosts') and whose guard_refused is
  `refused`, as this process sees it ('': it tries; ssh hosts say for
  themselves)."""
  if mode == 'off':
    return 'off (--port_guard=off)'
  if refused:
    return refused
  if kind == 'this_host' and not is_root:
    return 'not applied (not root)'
  if kind == 'this_host' and not has_iptables:
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
    self.chain = chain or port_rules.chain_name()
    self.rules = {host: port_rules.Rules(self.chain, tuple(sources),
                                        port_rules.port_ranges(ports))
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
    results = self._each(list(self.rules), port_rules.add_script)
    self.applied = [host for host, why in results.items() if why is None]
    return {host: why for host, why in results.items() if why is not None}

  def remove(self) -> List[str]:
    """Removes the rules from every host they were added on; a line for
    each host where that failed."""
    failed = self._each(self.applied, port_rules.remove_script,
                        _REMOVE_TIMEOUT)
    self.applied = []
    return [f'port guard: could not remove iptables chain {self.chain} on '
            f'{host or "this host"} ({why}): remove it there ({_DOCS})'
            for host, why in failed.items() if why]

  def lines(self) -> List[str]:
    """What it runs on each host, as --dry_run prints it: once for the
    hosts that get the same rules, HOST standing for each (one line per
    host listed every host's address in each: 55 MB at 1,000 hosts)."""
    hosts_of: Dict[port_rules.Rules, List[str]] = {}
    for host, rules in self.rules.items():
      hosts_of.setdefault(rules, []).append(host)
    lines = []
    for rules, hosts in hosts_of.items():
      if len(hosts) == 1 or THIS_HOST in hosts:
        lines += [f'port guard on {_name(host)}: '
                  f'{shlex.join(self.argv(host, port_rules.add_script(rules)))}'
                  for host in hosts]
      else:
        script = port_rules.add_script(rules)
        lines.append(f'port guard on each of {", ".join(hosts)}: '
                     f'{shlex.join(self.argv("HOST", script))}')
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


def for_job(mode: str, kind: str, refused: str, hosts: Sequence[str],
            tf_ports: Sequence[int], mpi: Optional[Tuple[int, int]],
            servers: Sequence[launch.DataServer], ssh: Sequence[str],
            is_root: bool, has_iptables: bool
            ) -> Tuple[Optional[Guard], str]:
  """The guard of a job (None: none) and, without one, the launcher's line
  saying why ('': nothing of the job listens). `kind` and `refused`: the
  placement's guard_kind and guard_refused (`cannot`). `hosts`: the
  training hosts (none: this host); `tf_ports`: multi_worker_mirrored's on
  each; `mpi`: OpenMPI's range where mpirun starts the workers."""
  ports_by_host = job_ports(hosts, tf_ports, mpi, servers)
  if not ports_by_host:
    return None, ''
  why = cannot(mode, kind, refused, is_root, has_iptables)
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
