"""Stand-ins for ssh, mpirun, srun and scontrol, answering the launcher as
the real ones would for a cluster of any size that exists only on this
host: `install(DIR)` writes them there (this file, run under each name);
put DIR first on PATH. Nothing contacts the network.

  ssh       answers the pre-flight's probe as a healthy host of its own
            (each its own machine), pretends to add or remove the port
            guard's rules (never this host's iptables), stays for the job
            as a host's OpenMPI daemon session (`orted`), runs any other
            command here; a host in the down file gets ssh's own failure
  mpirun    with STANDIN_SESSIONS set, starts the ssh sessions OpenMPI's
            rsh launch keeps for the job: one to each of the first 64
            hosts of its hostfile (its tree spawn, routed_radix 64: their
            daemons reach the rest), or to every host with
            OMPI_MCA_plm_rsh_no_tree_spawn=1; the job ends
            at once, or after STANDIN_JOB_SECONDS; with STANDIN_LOSE=HOST
            its first run loses HOST (mpirun's lines for a lost daemon,
            HOST in the down file)
  srun      the same, with srun's line for a failed node
  scontrol  show node (NodeAddr 127.1.X.Y: the node's place in
            SLURM_JOB_NODELIST), show job (its nodes less the down ones),
            show hostnames, requeue

Environment: STANDIN_DIR (required where they run: where the records go), STANDIN_DELAY
(seconds each command takes before it answers, default 0). Records in
STANDIN_DIR: `events` (one JSON line per start and end of a command, with
the ssh sessions open when each started) and `down` (the lost hosts).
"""

import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ('ssh', 'mpirun', 'srun', 'scontrol')
DIR = os.environ.get('STANDIN_DIR', '')
DELAY = float(os.environ.get('STANDIN_DELAY', '0'))
JOB_SECONDS = float(os.environ.get('STANDIN_JOB_SECONDS', '0'))


def install(directory: str) -> str:
  """Writes the stand-ins into `directory` (run by this Python without its
  site packages: a thousand of them start in seconds); returns it."""
  for name in COMMANDS:
    path = os.path.join(directory, name)
    with open(path, 'w') as f:
      f.write(f'#!{sys.executable} -S\nimport runpy\n'
              f'runpy.run_path({os.path.abspath(__file__)!r}, '
              f"{{'COMMAND': {name!r}}}, '__main__')\n")
    os.chmod(path, 0o755)
  return directory


def events(directory: str):
  """The records of STANDIN_DIR=`directory`, in time order."""
  try:
    with open(os.path.join(directory, 'events')) as f:
      return sorted((json.loads(line) for line in f), key=lambda e: e['time'])
  except FileNotFoundError:
    return []
_RADIX = 64  # OpenMPI 4.1's routed_radix: the daemons mpirun starts itself.
# Options of ssh that take a value (as `ssh -p PORT -o X=Y -- HOST CMD`).
_SSH_VALUED = set('BbcDEeFIiJLlmOoPpQRSWw')


def record(**event) -> None:
  """One line of `events`: whole lines, whatever runs at the same time."""
  line = json.dumps({'time': time.time(), 'pid': os.getpid(), **event})
  with open(os.path.join(DIR, 'events'), 'a') as f:
    f.write(line + '\n')  # One write of O_APPEND: never interleaved.


def down_hosts() -> set:
  try:
    with open(os.path.join(DIR, 'down')) as f:
      return set(f.read().split())
  except FileNotFoundError:
    return set()


def lose(host: str) -> None:
  with open(os.path.join(DIR, 'down'), 'a') as f:
    f.write(host + '\n')


class Open:
  """A session counted in DIR/open while it lasts: each start records how
  many were open then (itself included), the figure a cap must bound."""

  def __init__(self, kind: str):
    self._path = os.path.join(DIR, 'open', f'{kind}.{os.getpid()}')
    self._kind = kind

  def __enter__(self):
    os.makedirs(os.path.dirname(self._path), exist_ok=True)
    open(self._path, 'w').close()
    count = sum(1 for name in os.listdir(os.path.dirname(self._path))
                if name.startswith(self._kind + '.'))
    record(event='start', kind=self._kind, open=count)
    return self

  def __exit__(self, *exc):
    os.unlink(self._path)
    record(event='end', kind=self._kind)


def _answer_once(remote: str) -> str:
  """What `remote` prints here, run once for every host that asks the same:
  the stand-in hosts are copies of this one (Python, TensorFlow, project)."""
  cache = os.path.join(DIR, 'answers')
  os.makedirs(cache, exist_ok=True)
  path = os.path.join(cache, str(uuid.uuid5(uuid.NAMESPACE_URL, remote)))
  with open(path + '.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(path):
      answer = subprocess.run(['sh', '-c', remote], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
      with open(path + '.tmp', 'w') as f:
        json.dump([answer.returncode, answer.stdout, answer.stderr], f)
      os.rename(path + '.tmp', path)
  with open(path) as f:
    return json.load(f)


def ssh(args) -> int:
  i = 0
  while i < len(args) and args[i].startswith('-') and args[i] != '--':
    flag = args[i]
    i += 2 if len(flag) == 2 and flag[1] in _SSH_VALUED else 1
  if i < len(args) and args[i] == '--':
    i += 1
  host, remote = args[i], ' '.join(args[i + 1:])
  port = next((a[2:] or args[n + 1] for n, a in enumerate(args[:i])
               if a.startswith('-p')), '22')
  daemon = remote.startswith('orted')  # mpirun's: there for the job.
  with Open('orted' if daemon else 'ssh'):
    time.sleep(DELAY)
    if host in down_hosts():
      print(f'ssh: connect to host {host} port {port}: No route to host',
            file=sys.stderr)
      return 255
    if daemon:
      time.sleep(float(remote.split()[-1]))
      return 0
    if 'iptables' in remote:  # The port guard's rules, as if added.
      return 0
    code, out, err = _answer_once(remote)
    if '"busy_ports"' in remote and code == 0:
      answer = json.loads(out.splitlines()[-1])
      answer['machine'] = str(uuid.uuid5(uuid.NAMESPACE_DNS, host))
      out = json.dumps(answer) + '\n'
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


def _value(args, *names):
  for n, arg in enumerate(args):
    for name in names:
      if arg == name:
        return args[n + 1]
      if arg.startswith(name + '='):
        return arg.split('=', 1)[1]
  return None


def _first_run(kind: str) -> bool:
  """Whether this is the job's first mpirun or srun (the one STANDIN_LOSE
  applies to)."""
  marker = os.path.join(DIR, f'{kind}.ran')
  try:
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    return True
  except FileExistsError:
    return False


def _sessions(hosts, seconds):
  """The ssh sessions mpirun's host keeps, as OpenMPI's rsh launch does."""
  if os.environ.get('OMPI_MCA_plm_rsh_no_tree_spawn') not in ('1', 'true'):
    hosts = hosts[:_RADIX]
  agent = os.environ.get('OMPI_MCA_plm_rsh_agent', 'ssh').split(':')[0]
  return [subprocess.Popen(shlex.split(agent) + ['--', host,
                                                 f'orted {seconds}'],
                           stdin=subprocess.DEVNULL)
          for host in hosts]


def mpirun(args) -> int:
  hostfile = _value(args, '--hostfile')
  hosts = []
  if hostfile:
    with open(hostfile) as f:
      hosts = [line.split()[0] for line in f if line.strip()]
  record(event='start', kind='mpirun', hosts=len(hosts),
         argv_bytes=len(' '.join(args)))
  lost = os.environ.get('STANDIN_LOSE')
  fails = lost and _first_run('mpirun')
  sessions = (_sessions(hosts, JOB_SECONDS if not fails else 0)
              if os.environ.get('STANDIN_SESSIONS') else [])
  time.sleep(DELAY if fails else max(DELAY, JOB_SECONDS))
  for session in sessions:
    session.wait()
  record(event='end', kind='mpirun')
  if fails:
    lose(lost)
    print('-' * 74)
    print('ORTE has lost communication with a remote daemon.\n')
    print('  HNP daemon   : [[36023,0],0] on node launcher')
    index = hosts.index(lost) + 1 if lost in hosts else 1
    print(f'  Remote daemon: [[36023,0],{index}] on node {lost}\n')
    print('This is usually due to either a failure of the TCP network')
    print('-' * 74, flush=True)
    return 1
  return 0


def srun(args) -> int:
  record(event='start', kind='srun', nodelist=_value(args, '--nodelist'),
         argv_bytes=len(' '.join(args)))
  lost = os.environ.get('STANDIN_LOSE')
  fails = lost and _first_run('srun')
  time.sleep(DELAY if fails else max(DELAY, JOB_SECONDS))
  record(event='end', kind='srun')
  if fails:
    lose(lost)
    print(f'srun: error: Node failure on {lost}', flush=True)
    print('srun: Job step aborted: Waiting up to 32 seconds for job step to '
          'finish.', flush=True)
    return 1
  return 0


def scontrol(args) -> int:
  sys.path.insert(0, REPO)
  from common import slurm  # pylint: disable=import-outside-toplevel
  time.sleep(DELAY)
  record(event='start', kind='scontrol', args=args[:2])
  job_nodes = slurm.expand_nodelist(os.environ.get('SLURM_JOB_NODELIST', ''))
  if args[:2] == ['show', 'hostnames']:
    print('\n'.join(slurm.expand_nodelist(args[2])))
  elif args[:2] == ['show', 'node']:
    place = {node: i for i, node in enumerate(job_nodes)}
    for node in slurm.expand_nodelist(args[2]):
      i = place.get(node, 0)
      print(f'NodeName={node} Arch=x86_64 CoresPerSocket=1\n'
            f'   NodeAddr=127.1.{i // 250}.{i % 250 + 1} '
            f'NodeHostName={node} Version=23.11.4\n'
            '   State=ALLOCATED ThreadsPerCore=1\n')
  elif args[:2] == ['show', 'job']:
    down = down_hosts()
    held = [node for node in job_nodes if node not in down]
    print(f'JobId={args[-1]} JobName=resnet_keras JobState=RUNNING '
          f'NodeList={slurm.compress_nodelist(held)} NumNodes={len(held)}')
  elif args[:1] == ['requeue']:
    pass
  else:
    print(f'scontrol stand-in: {shlex.join(args)} is not answered',
          file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(globals()[COMMAND](sys.argv[1:]))  # Set by install's script.
