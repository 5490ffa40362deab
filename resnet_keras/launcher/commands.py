"""How training processes are started: mpirun commands and TF_CONFIG, as data.

Everything here is a pure function of its arguments (the environment and the
machine's core count are passed in), so `demo_resnet_keras.py --dry_run`
prints exactly what a real launch runs, and tests check commands without
starting anything. Used by the launcher (to build commands) and by the
trainer (to turn an MPI rank into a TF_CONFIG for multi_worker_mirrored).
"""

import dataclasses
import ipaddress
import json
import os
import re
import shlex
import socket
from typing import Dict, List, Mapping, Optional, Sequence

from resnet_keras.launcher import supervisor
from common.errors import UsageError


DEFAULT_SSH_PORT = 3022
# The tf.data service's dispatcher; each data worker listens on the next.
DEFAULT_DATA_SERVICE_PORT = 5050
DEFAULT_TF_BASE_PORT = 2410
DEFAULT_FAILURE_TIMEOUT = 60
# multi_worker_mirrored's collective timeout (seconds), read by the trainer.
COLLECTIVE_TIMEOUT_VAR = 'RESNET_KERAS_COLLECTIVE_TIMEOUT'
# A rank alive but stuck (not a lost one) ends the job after this many
# failure timeouts: long enough for the chief's pauses (checkpoint, export)
# that the other workers wait through.
_STALL_SHUTDOWN_FACTOR = 10
# Variables every rank needs from the launching shell (exported with -x when
# set). Prefixes cover whole families.
FORWARDED_ENV = ('PATH', 'PYTHONPATH', 'LD_LIBRARY_PATH', 'LD_PRELOAD',
                 'MULTI_HLS_IPS', 'MPI_TCP_INCLUDE', 'TF_BASE_PORT',
                 'CUDA_VISIBLE_DEVICES', 'MALLOC_CONF')
FORWARDED_ENV_PREFIXES = ('TF_', 'HOROVOD_', 'NCCL_', 'OMP_', 'KMP_', 'ONEDNN_',
                          'DNNL_', 'RESNET_KERAS_')
# Rank and world size as the common MPI launchers publish them.
# Last, Slurm's, of a task of an srun step (a batch script has no step).
_RANK_VARS = (('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
              ('PMI_RANK', 'PMI_SIZE'), ('PMIX_RANK', 'PMIX_SIZE'),
              ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS'))


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


# A host name as DNS, /etc/hosts and Slurm write them (underscores too):
# never an option (a leading '-') nor anything a shell or ssh reads as
# more than a name.
_HOST_NAME = re.compile(r'[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}')


def check_host(host: str, source: str) -> str:
  """`host` if it is a host name or an IPv4/IPv6 address; UsageError
  naming `source` (where it was given) otherwise. The hosts reach ssh,
  mpirun's hostfile and srun as arguments."""
  if _HOST_NAME.fullmatch(host):
    return host
  try:
    ipaddress.ip_address(host)
    return host
  except ValueError:
    raise UsageError(f'{source}: {host!r} is not a host name or an IP '
                     'address (letters, digits, ".", "-" and "_", not '
                     'starting with "-"; or an IPv4/IPv6 address)') from None


def parse_hosts(multi_hls_ips: Optional[str]) -> List[str]:
  """MULTI_HLS_IPS ('ip1,ip2,...') -> host list; empty: this host only."""
  if not multi_hls_ips:
    return []
  hosts = [check_host(h.strip(), 'MULTI_HLS_IPS')
           for h in multi_hls_ips.split(',') if h.strip()]
  if len(set(hosts)) != len(hosts):
    raise UsageError(f'MULTI_HLS_IPS={multi_hls_ips} lists a host twice; '
                      'give each host once')
  return hosts


def cores_per_worker(physical_cores: int, workers_per_host: int) -> int:
  """Physical cores each worker gets (0: fewer cores than workers)."""
  return physical_cores // workers_per_host


def mpirun_command(program: Sequence[str], *, workers_per_host: int,
                   hosts: Sequence[str], physical_cores: int,
                   environ: Mapping[str, str], hostfile_path: str,
                   extra_env: Optional[Dict[str, str]] = None,
                   failure_timeout: int = DEFAULT_FAILURE_TIMEOUT,
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
  if hosts:
    files[hostfile_path] = ''.join(
        f'{h} slots={workers_per_host}\n' for h in hosts)
    ssh_port = environ.get('DOCKER_SSHD_PORT', str(DEFAULT_SSH_PORT))
    argv += ['--hostfile', hostfile_path,
             '--mca', 'plm_rsh_args', f'-p{ssh_port}']
  if environ.get('MPI_TCP_INCLUDE'):
    interfaces = environ['MPI_TCP_INCLUDE']
    argv += ['--mca', 'btl_tcp_if_include', interfaces,
             '--mca', 'oob_tcp_if_include', interfaces]
  if environ.get('MPI_ROOT'):
    argv += ['--prefix', environ['MPI_ROOT']]
  argv += keepalive_args(failure_timeout)
  # The supervisor sets the attempt's variables for mpirun when it runs it.
  for name in sorted({*forwarded_env_names(environ), *supervisor.ATTEMPT_VARS}):
    argv += ['-x', name]
  return Launch(argv=argv + list(program), env=extra_env, files=files,
                notes=notes)


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


def failure_env(failure_timeout: int, use_horovod: bool) -> Dict[str, str]:
  """What the workers need to end a stuck job themselves.

  Horovod: its stall check names the ranks that have not joined a collective
  after `failure_timeout` seconds, and shuts the job down after
  _STALL_SHUTDOWN_FACTOR times that. multi_worker_mirrored: the same
  shutdown time as the collectives' timeout.
  """
  shutdown = str(stuck_rank_timeout(failure_timeout))
  if use_horovod:
    return {'HOROVOD_STALL_CHECK_TIME_SECONDS': str(failure_timeout),
            'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': shutdown}
  return {COLLECTIVE_TIMEOUT_VAR: shutdown}


def stuck_rank_timeout(failure_timeout: int) -> int:
  """Seconds after which a rank alive but stuck ends the job."""
  return failure_timeout * _STALL_SHUTDOWN_FACTOR


def collective_timeout(environ: Mapping[str, str]) -> Optional[float]:
  """multi_worker_mirrored's collective timeout in seconds (None: none)."""
  value = environ.get(COLLECTIVE_TIMEOUT_VAR)
  try:
    return float(value) if value else None
  except ValueError:
    raise UsageError(f'{COLLECTIVE_TIMEOUT_VAR}={value} is not a number of '
                     'seconds') from None


def this_host(environ: Mapping[str, str]) -> Dict[str, str]:
  """This process's hostname and the address it reaches the job's first
  host from (MULTI_HLS_IPS; its own address on that network), for the run's
  record of where each worker ran."""
  hosts = parse_hosts(environ.get('MULTI_HLS_IPS'))
  address = ''
  if hosts:
    try:
      address = address_toward(hosts[0])
    except OSError:
      pass
  return {'hostname': socket.gethostname(), 'address': address}


def address_toward(host: str, port: int = 9) -> str:
  """This host's address on the route to `host` (OSError: no route)."""
  # Connecting a UDP socket only picks the route; it sends nothing.
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    probe.connect((host, port))
    return probe.getsockname()[0]


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


def mpi_rank_and_size(environ: Mapping[str, str]):
  """(rank, size) from an MPI launcher's environment, or None."""
  for rank_var, size_var in _RANK_VARS:
    if rank_var in environ and size_var in environ:
      return int(environ[rank_var]), int(environ[size_var])
  return None


def tf_config_for_rank(rank: int, size: int, hosts: Sequence[str],
                       base_port: int = DEFAULT_TF_BASE_PORT) -> Dict:
  """TF_CONFIG of worker `rank` among `size`, laid out as mpirun places them.

  mpirun fills each host's slots before the next host, so rank r runs on
  host r // per_host with local rank r % per_host, and listens on
  base_port + local rank (several workers share a host).
  """
  hosts = list(hosts) or ['localhost']
  if size % len(hosts):
    raise UsageError(f'{size} workers cannot be spread evenly over '
                      f'{len(hosts)} hosts in MULTI_HLS_IPS')
  per_host = size // len(hosts)
  workers = [f'{hosts[r // per_host]}:{base_port + r % per_host}'
             for r in range(size)]
  return {'cluster': {'worker': workers},
          'task': {'type': 'worker', 'index': rank}}


def tf_base_port(environ: Mapping[str, str], workers_per_host: int) -> int:
  """TF_BASE_PORT (default DEFAULT_TF_BASE_PORT), checked: a host's
  workers listen on it and the `workers_per_host` - 1 ports above it."""
  value = environ.get('TF_BASE_PORT', str(DEFAULT_TF_BASE_PORT))
  highest = 65536 - max(1, workers_per_host)
  try:
    port = int(value)
  except ValueError:
    port = None
  if port is None or not 1 <= port <= highest:
    raise UsageError(f'TF_BASE_PORT={value}: the {workers_per_host} '
                     'worker(s) of a host listen on it and the ports above '
                     f'it; give a port number from 1 to {highest}')
  return port


def tf_config_from_env(rank: int, size: int,
                       environ: Mapping[str, str]) -> Dict:
  """TF_CONFIG of worker `rank`, hosts from MULTI_HLS_IPS, ports from
  TF_BASE_PORT."""
  hosts = parse_hosts(environ.get('MULTI_HLS_IPS'))
  base_port = tf_base_port(environ, size // max(1, len(hosts)))
  return tf_config_for_rank(rank, size, hosts, base_port)


def tf_config_from_mpi(environ: Mapping[str, str]) -> Optional[str]:
  """The TF_CONFIG (JSON) this MPI rank should use, or None outside MPI."""
  rank_size = mpi_rank_and_size(environ)
  if rank_size is None:
    return None
  return json.dumps(tf_config_from_env(*rank_size, environ))


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


@dataclasses.dataclass(frozen=True)
class DataServer:
  """A tf.data service server the launcher starts on a host over ssh."""
  host: str
  role: str  # 'dispatcher' or 'worker'
  port: int
  argv: List[str]  # ssh ... -- HOST 'cd REPO && exec python -m ...'
  stop_argv: List[str]  # ssh ... -- HOST 'pkill ...': what ends it there


def data_service_servers(hosts: Sequence[str], ssh: Sequence[str],
                         python: str, repo: str, port: int,
                         work_dir: str) -> List[DataServer]:
  """The dispatcher on the first of `hosts` (at `port`, journaling to
  `work_dir` there) and a data worker on each (at port + 1), started over
  `ssh` in the project at `repo` (the same path on every host)."""
  servers = [('dispatcher', hosts[0], port, ['--work_dir', work_dir])]
  servers += [('worker', host, port + 1, ['--dispatcher', f'{hosts[0]}:{port}'])
              for host in hosts]
  built = []
  for role, host, server_port, args in servers:
    head = [python, '-m', 'resnet_keras.data.service', role, '--port',
            str(server_port)]
    # SIGTERM (the server stops itself), then SIGKILL for what is left
    # after 10 s; only this user's processes.
    match = f'-U "$(id -u)" -f {shlex.quote(server_pattern(head))}'
    stop = (f'pkill {match}; for _ in $(seq 50); do pgrep {match} '
            f'>/dev/null || exit 0; sleep 0.2; done; pkill -KILL {match}')
    command = head + args
    built.append(DataServer(
        host=host, role=role, port=server_port,
        argv=list(ssh) + ['--', host, f'cd {shlex.quote(repo)} && exec '
                          f'{shlex.join(command)}'],
        stop_argv=list(ssh) + ['--', host, stop]))
  return built


def server_pattern(head: Sequence[str]) -> str:
  """pgrep's extended regular expression for exactly the processes whose
  command line begins with the words `head`: anchored at its start (never
  the shell that runs pkill) and at the end of the last word (port 5051
  is not 50510, another job's)."""
  words = [re.sub(r'([.\[\]{}()\\*+?^$|])', r'\\\1', word) for word in head]
  return '^' + ' '.join(words) + '( |$)'


def data_service_address(hosts: Sequence[str], port: int) -> str:
  """The dispatcher's address, as the trainer's --tf_data_service."""
  return f'grpc://{hosts[0]}:{port}'
