"""The commands the launcher builds, as data: mpirun's, and the tf.data
service's servers over ssh.

Everything here is a pure function of its arguments (the environment and the
machine's core count are passed in), so `demo_resnet_keras.py --dry_run`
prints exactly what a real launch runs, and tests check commands without
starting anything. What a worker reads of them (TF_CONFIG from its rank, the
attempt's variables) is common/worker_contract.py.
"""

import dataclasses
import os
import shlex
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from common import hosts as hosts_lib
from common import worker_contract
from common.errors import UsageError


DEFAULT_SSH_PORT = 3022
# The tf.data service's dispatcher; each data worker listens on the next.
DEFAULT_DATA_SERVICE_PORT = 5050
# Variables every rank needs from the launching shell (exported with -x when
# set). Prefixes cover whole families.
FORWARDED_ENV = ('PATH', 'PYTHONPATH', 'LD_LIBRARY_PATH', 'LD_PRELOAD',
                 worker_contract.HOSTS_VAR, 'MPI_TCP_INCLUDE',
                 worker_contract.TF_BASE_PORT_VAR, 'CUDA_VISIBLE_DEVICES',
                 'MALLOC_CONF')
FORWARDED_ENV_PREFIXES = ('TF_', 'HOROVOD_', 'NCCL_', 'OMP_', 'KMP_', 'ONEDNN_',
                          'DNNL_', worker_contract.OWN_PREFIX)


@dataclasses.dataclass(frozen=True)
class Launch:
  """One command to exec, its extra environment and files it needs."""
  argv: List[str]
  env: Dict[str, str]
  files: Dict[str, str]  # path -> content, written before exec
  notes: List[str]  # lines for the log (e.g. why binding is off)

  def describe(self) -> str:
    lines = [f'command: {shlex.join(self.argv)}']
    lines += [f'env: {k}={v}' for k, v in sorted(self.env.items())]
    for path, content in self.files.items():
      lines.append(f'file {path}:')
      lines += [f'  {line}' for line in content.splitlines()]
    return '\n'.join(lines)




def cores_per_worker(physical_cores: int, workers_per_host: int) -> int:
  """Physical cores each worker gets (0: fewer cores than workers)."""
  return physical_cores // workers_per_host


def mpirun_command(program: Sequence[str], *, workers_per_host: int,
                   hosts: Sequence[str], physical_cores: int,
                   environ: Mapping[str, str], hostfile_path: str,
                   extra_env: Optional[Dict[str, str]] = None,
                   failure_timeout: int = worker_contract.DEFAULT_FAILURE_TIMEOUT,
                   hosts_per_machine: int = 1, as_root: bool) -> Launch:
  """The mpirun invocation that starts `program` on every worker.

  Args:
    program: argv of one worker (python, script, flags).
    workers_per_host: processes per host (--num_workers_per_hls).
    hosts: MULTI_HLS_IPS hosts; empty for this host only.
    physical_cores: physical cores of this host (binding assumes the others
      are alike).
    environ: the launching environment (variables to forward, MPI_ROOT,
      MPI_TCP_INCLUDE, DOCKER_SSHD_PORT).
    hostfile_path: where the multi-host hostfile is written.
    extra_env: variables the launcher adds for the job (forwarded too).
    failure_timeout: seconds within which a lost host or rank ends the job.
    hosts_per_machine: how many of `hosts` are one machine (containers or
      namespaces of one server, as the pre-flight check finds them): their
      workers share its cores.
    as_root: whether the launcher runs as root (os.geteuid() == 0): mpirun
      refuses root without --allow-run-as-root, which it gets only then.
  """
  extra_env = dict(extra_env or {})
  environ = {**environ, **extra_env}
  num_hosts = max(1, len(hosts))
  argv = ['mpirun'] + (['--allow-run-as-root'] if as_root else []) + [
      '-np', str(workers_per_host * num_hosts)]
  notes = []
  pe = cores_per_worker(physical_cores, workers_per_host * hosts_per_machine)
  if hosts_per_machine > 1:
    # Each host's daemon binds its own ranks from core 0 up, unaware of the
    # other hosts on the machine: binding would stack them on the same cores.
    argv += ['--bind-to', 'none']
    notes.append(f'{hosts_per_machine} hosts share one machine: not binding '
                 'workers to cores')
    if pe < 1:
      # mpirun cannot see this oversubscription, and its ranks would
      # busy-poll the shared cores away from the ones doing the work.
      argv += ['--mca', 'mpi_yield_when_idle', '1']
  elif pe >= 1:
    argv += ['--bind-to', 'core', '--map-by', f'socket:PE={pe}']
  else:
    # More workers than cores is deliberate (e.g. tests on a small box):
    # binding would fail, and mpirun refuses more ranks than slots.
    argv += ['--bind-to', 'none', '--oversubscribe']
    notes.append(f'{workers_per_host} workers per host but {physical_cores} '
                 'physical cores: not binding workers to cores')
  argv += ['--tag-output', '--merge-stderr-to-stdout']
  files = {}
  ipv6 = [host for host in hosts if hosts_lib.is_ipv6(host)]
  if ipv6:
    # Measured with OpenMPI 4.1.4: 'the regex parser has detected the
    # presence of an illegal character in the following node name: ::1'.
    raise UsageError(f'{worker_contract.HOSTS_VAR}: {ipv6[0]} is an IPv6 '
                     'address, which mpirun does not take as a host (its '
                     'node names are letters, digits, "-" and "."): give '
                     'the hosts\' names (/etc/hosts or DNS) instead')
  if hosts:
    files[hostfile_path] = ''.join(
        f'{h} slots={workers_per_host}\n' for h in hosts)
    argv += ['--hostfile', hostfile_path,
             '--mca', 'plm_rsh_args', f'-p{ssh_port(environ)}']
  if environ.get('MPI_TCP_INCLUDE'):
    interfaces = environ['MPI_TCP_INCLUDE']
    argv += ['--mca', 'btl_tcp_if_include', interfaces,
             '--mca', 'oob_tcp_if_include', interfaces]
  if environ.get('MPI_ROOT'):
    argv += ['--prefix', environ['MPI_ROOT']]
  argv += keepalive_args(failure_timeout)
  # The supervisor sets the attempt's variables for mpirun when it runs it.
  for name in sorted({*forwarded_env_names(environ),
                      *worker_contract.ATTEMPT_VARS}):
    argv += ['-x', name]
  return Launch(argv=argv + list(program), env=extra_env, files=files,
                notes=notes)


def ssh_port(environ: Mapping[str, str]) -> str:
  """DOCKER_SSHD_PORT (default DEFAULT_SSH_PORT), checked: ssh and mpirun
  would take anything as a port and fail host by host."""
  port = environ.get('DOCKER_SSHD_PORT', str(DEFAULT_SSH_PORT))
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise UsageError(f'DOCKER_SSHD_PORT={port!r} is not a port: give the '
                     'port sshd listens on in every host, from 1 to 65535')
  return port


def keepalive_args(failure_timeout: int) -> List[str]:
  """mpirun's out-of-band TCP keepalive, so a host that stops answering
  ends the job within about `failure_timeout` seconds.

  mpirun learns of a lost host only from its connection to that host's
  daemon; the training ranks' own connections just wait. OpenMPI's defaults
  (300 s idle, then 9 probes 20 s apart) take 8 minutes; here probing starts
  after a quarter of the timeout and 3 unanswered probes, a twelfth of it
  apart, end it, leaving the rest for the job to come down. An outage shorter
  than the probes is survived.
  """
  if failure_timeout < 12:
    raise UsageError(f'--failure_timeout={failure_timeout} is too short to '
                     'tell a lost host from a busy one; use at least 12 '
                     'seconds')
  return ['--mca', 'oob_tcp_keepalive_time', str(failure_timeout // 4),
          '--mca', 'oob_tcp_keepalive_intvl', str(failure_timeout // 12),
          '--mca', 'oob_tcp_keepalive_probes', '3']


def strip_flags(args: Sequence[str], boolean: Sequence[str],
                valued: Sequence[str]) -> List[str]:
  """`args` without the named flags, in any absl spelling.

  Boolean flags: --x, --nox, --x=v. Valued flags: --x v, --x=v (one or two
  leading dashes).
  """
  out, skip_next = [], False
  for arg in args:
    if skip_next:
      skip_next = False
      continue
    name = arg.lstrip('-').split('=', 1)[0] if arg.startswith('-') else None
    if name in valued:
      skip_next = '=' not in arg
      continue
    if name in boolean or (name and name.startswith('no') and
                           name[2:] in boolean):
      continue
    out.append(arg)
  return out


def forwarded_env_names(environ: Mapping[str, str]) -> List[str]:
  """Names of the set variables every rank must see."""
  return sorted(name for name in environ
                if name in FORWARDED_ENV or
                name.startswith(FORWARDED_ENV_PREFIXES))


def physical_core_count() -> int:
  """Physical cores of this machine (hyperthread siblings counted once)."""
  cores = set()
  root = '/sys/devices/system/cpu'
  for name in os.listdir(root) if os.path.isdir(root) else []:
    topology = os.path.join(root, name, 'topology')
    if not (name.startswith('cpu') and name[3:].isdigit() and
            os.path.isdir(topology)):
      continue
    with open(os.path.join(topology, 'physical_package_id')) as f:
      package = f.read().strip()
    with open(os.path.join(topology, 'core_id')) as f:
      cores.add((package, f.read().strip()))
  return len(cores) or os.cpu_count() or 1


# The first line a server's remote shell prints, before it becomes the
# server: its PID and that process's start time (in clock ticks since boot),
# by which the launcher stops it and only it. A pattern of its command line
# matched another job's server on the same interpreter and port (as root,
# any user's); a PID alone may be a later process's by then.
PID_LINE = 'resnet_keras data server: pid'
# The start time of process {} from /proc/{}/stat: its 22nd field, the
# 20th after the name in parentheses (which may hold spaces).
_START_TIME = "sed 's/.*) //' /proc/{}/stat 2>/dev/null | cut -d' ' -f20"
# Whether process $p is the one that started at $t, and not yet ended (a
# zombie's parent may take its time to reap it: seconds on gVisor).
_SAME = ("s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1,20); "
         '[ "${s#? }" = "$t" ] && [ "${s%% *}" != Z ]')


@dataclasses.dataclass(frozen=True)
class DataServer:
  """A tf.data service server the launcher starts on a host over ssh."""
  host: str
  role: str  # 'dispatcher' or 'worker'
  port: int
  # ssh ... -- HOST 'cd REPO && echo PID_LINE ... && exec python -m ...'
  argv: List[str]
  ssh: Tuple[str, ...]

  def stop_argv(self, pid: str, started: str) -> List[str]:
    """What ends the server that reported `pid` and `started` (PID_LINE)
    on its host: SIGTERM (it stops itself), then SIGKILL after 10 s, each
    only while that PID is still the process that started then."""
    script = (f'p={shlex.quote(pid)}; t={shlex.quote(started)}; '
              f'same() {{ {_SAME}; }}; same || exit 0; kill "$p"; '
              'for _ in $(seq 50); do same || exit 0; sleep 0.2; done; '
              'kill -KILL "$p"')
    return list(self.ssh) + ['--', self.host, script]


def read_pid_line(line: str) -> Optional[Tuple[str, str]]:
  """(pid, start time) of a server's PID_LINE; None for any other line."""
  words = line.split()
  if (line.startswith(PID_LINE) and len(words) == len(PID_LINE.split()) + 2
      and all(word.isdigit() for word in words[-2:])):
    return words[-2], words[-1]
  return None


def data_service_servers(hosts: Sequence[str], ssh: Sequence[str],
                         python: str, repo: str, port: int,
                         work_dir: str) -> List[DataServer]:
  """The dispatcher on the first of `hosts` (at `port`, journaling to
  `work_dir` there) and a data worker on each (at port + 1), started over
  `ssh` in the project at `repo` (the same path on every host)."""
  servers = [('dispatcher', hosts[0], port, ['--work_dir', work_dir])]
  servers += [('worker', host, port + 1,
               ['--dispatcher', hosts_lib.host_port(hosts[0], port)])
              for host in hosts]
  # $$ is the remote shell's PID, which `exec` hands to the server.
  report = f'echo "{PID_LINE} $$ $({_START_TIME.format("$$")})"'
  built = []
  for role, host, server_port, args in servers:
    command = [python, '-m', 'resnet_keras.data.service', role, '--port',
               str(server_port)] + args
    built.append(DataServer(
        host=host, role=role, port=server_port,
        argv=list(ssh) + ['--', host, f'cd {shlex.quote(repo)} && {report} '
                          f'&& exec {shlex.join(command)}'],
        ssh=tuple(ssh)))
  return built


def data_service_address(hosts: Sequence[str], port: int) -> str:
  """The dispatcher's address, as the trainer's --tf_data_service."""
  return f'grpc://{hosts_lib.host_port(hosts[0], port)}'
