"""Checks the hosts of a multi-host launch before anything starts on them.

mpirun reports an unreachable host, a missing script or a different Python
only after it started the others, often as a hang or a traceback on one
rank. Here each host is asked, over the ssh mpirun will use, for what the
job needs: the same Python interpreter, the same TensorFlow (and Horovod)
version, the project's files, and the TF_CONFIG ports free. Every problem is
one line naming the host and what to fix.
"""

import collections
import dataclasses
import json
import shlex
import subprocess
import sys
from importlib import metadata
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from common import hosts as hosts_lib
from common import worker_contract
from resnet_keras.launcher import fanout

# Seconds a host's answer may take (ssh's connection half of it); the
# polls of an elastic job's dropped hosts take less (QUICK_TIMEOUT): a
# launcher ending waits for the poll in flight.
SSH_TIMEOUT = 20
QUICK_TIMEOUT = 8
# Runs on each host with the launcher's Python: prints what the host has.
_PROBE = '''
import json, os, socket, sys
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
busy = []
for port in json.loads(sys.argv[2]):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            busy.append(port)
def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None
print(json.dumps({"python": sys.version.split()[0],
                  "machine": boot_id(),
                  "tensorflow": version("tensorflow"),
                  "horovod": version("horovod"),
                  "project": os.path.isfile(sys.argv[1]),
                  "busy_ports": busy}))
'''


@dataclasses.dataclass(frozen=True)
class Expected:
  """What every host must have: this host's values."""
  python: str  # Interpreter path (the ranks are started with it).
  python_version: str
  tensorflow: Optional[str]
  horovod: Optional[str]  # None: the job does not use Horovod.
  script: str  # The trainer, at the same path on every host.


def expected(script: str, use_horovod: bool) -> Expected:
  return Expected(python=sys.executable,
                  python_version=sys.version.split()[0],
                  tensorflow=_version('tensorflow'),
                  horovod=_version('horovod') if use_horovod else None,
                  script=script)


def _version(name: str) -> Optional[str]:
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


def ssh_command(environ: Mapping[str, str], port: str,
                timeout: int = SSH_TIMEOUT) -> List[str]:
  """ssh as mpirun runs it: OpenMPI's rsh agent when one is set."""
  agent = environ.get('OMPI_MCA_plm_rsh_agent', '')
  argv = shlex.split(agent.split(':')[0]) if agent else ['ssh']
  return argv + ['-p', port, '-o', 'BatchMode=yes', '-o',
                 f'ConnectTimeout={timeout // 2}']


def describe(hosts: Sequence[str], ssh: Sequence[str], want: Expected,
             ports: Mapping[str, Sequence[int]]) -> List[str]:
  """The checks, as --dry_run prints them."""
  lines = [f'pre-flight on each of {", ".join(hosts)}: {shlex.join(ssh)} '
           f'-- HOST answers; {want.python} runs Python {want.python_version} '
           f'with TensorFlow {want.tensorflow}' +
           (f' and Horovod {want.horovod}' if want.horovod else '') +
           f'; {want.script} exists']
  for host, host_ports in ports.items():
    if host_ports:
      lines.append(f'pre-flight on {host}: ports '
                   f'{", ".join(map(str, host_ports))} free')
  return lines


def problems_of(host: str, answer: Dict, want: Expected) -> List[str]:
  """What `host`'s `answer` lacks, each as what to fix."""
  found = []
  if answer['python'] != want.python_version:
    found.append(f'{want.python} is Python {answer["python"]}, not '
                 f'{want.python_version} as here')
  if answer['tensorflow'] != want.tensorflow:
    found.append(f'TensorFlow {answer["tensorflow"] or "is not installed"}'
                 f', not {want.tensorflow} as here')
  if want.horovod and answer['horovod'] != want.horovod:
    found.append(f'Horovod {answer["horovod"] or "is not installed"}, not '
                 f'{want.horovod} as here (scripts/install_horovod.sh)')
  if not answer['project']:
    found.append(f'{want.script} is missing: the project must be at the '
                 'same path on every host')
  if answer['busy_ports']:
    found.append(f'port(s) {", ".join(map(str, answer["busy_ports"]))} in '
                 'use: stop what holds them or set TF_BASE_PORT')
  return [f'host {host}: {problem}' for problem in found]


def _check_host(host: str, ssh: Sequence[str], want: Expected,
                ports: Sequence[int], port: str,
                timeout: int) -> Tuple[List[str], Dict]:
  """(problems, what the host answered)."""
  remote = shlex.join([want.python, '-c', _PROBE, want.script,
                       json.dumps(list(ports))])
  try:
    result = subprocess.run(list(ssh) + ['--', host, remote],
                            capture_output=True,
                            text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired:
    return [f'host {host}: no answer over ssh on port {port} within '
            f'{timeout} s: check the host is up and reachable'], {}
  if result.returncode == 255:  # ssh's own failure.
    reason = (result.stderr.strip().splitlines() or ['no reason given'])[-1]
    return [f'host {host}: ssh on port {port} failed ({reason}): '
            f'{_ssh_advice(reason)}'], {}
  if result.returncode != 0:  # The probe prints its answer and exits 0.
    return [f'host {host}: cannot run {want.python} there: install the same '
            'Python at the same path on every host'], {}
  answer = json.loads(result.stdout.strip().splitlines()[-1])
  return problems_of(host, answer, want), answer


# ssh's words for a host it could not reach at all (down, cut off, no such
# name), as opposed to one that answered and refused.
_UNREACHABLE = ('timed out', 'No route to host', 'Network is unreachable',
                'Could not resolve')


def _ssh_advice(reason: str) -> str:
  if any(words in reason for words in _UNREACHABLE):
    return 'check the host is up and reachable from here'
  return 'start sshd there on DOCKER_SSHD_PORT and authorise this host\'s key'


@dataclasses.dataclass(frozen=True)
class Report:
  problems: List[str]  # One line per problem; none: every host is ready.
  hosts_per_machine: int  # Most hosts found on one machine (same boot id).
  ready: Tuple[str, ...] = ()  # The hosts without a problem, in order.


def check(hosts: Sequence[str], ssh: Sequence[str], want: Expected,
          ports: Mapping[str, Sequence[int]], port: str,
          timeout: int = SSH_TIMEOUT) -> Report:
  """Asks every host, fanout.MAX_SESSIONS at a time, each within
  `timeout` seconds (`ssh`'s ConnectTimeout: half of it)."""
  results = fanout.each_host(
      hosts, lambda host: _check_host(host, ssh, want, ports.get(host, ()),
                                      port, timeout))
  machines = collections.Counter(answer.get('machine') for lines, answer
                                 in results
                                 if not lines and answer.get('machine'))
  return Report(problems=[line for lines, _ in results for line in lines],
                hosts_per_machine=max(machines.values(), default=1),
                ready=tuple(host for host, (lines, _) in zip(hosts, results)
                            if not lines))


def ports_by_host(workers: Sequence[str]) -> Dict[str, List[int]]:
  """TF_CONFIG's worker addresses ('host:port', '[ipv6]:port') -> the
  ports each host's workers listen on."""
  ports = collections.defaultdict(list)
  for address in workers:
    host, port = hosts_lib.split_host_port(address,
                                           worker_contract.TF_CONFIG_VAR)
    ports[host].append(port)
  return dict(ports)
