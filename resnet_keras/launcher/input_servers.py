"""The tf.data service servers a launch starts on other hosts, for its whole
length: started over ssh and awaited, watched, and stopped on every path.

demo_resnet_keras.py --data_service_hosts builds their commands
(launch.data_service_servers), starts them here before the training job,
and stops them when the job ends, however it ends (success, failure,
Ctrl-C). Each server's output passes through prefixed with its host and
role; a server that exits while the job runs is said at once (a lost data
worker: training goes on with the others; the dispatcher: training waits
for it up to the trainer's --tf_data_service_timeout). When the launcher
restarts the job (--max_restarts), `renew` starts the lost servers again on
hosts that pass its check, the dispatcher from its journal (--work_dir),
and leaves out the data workers of hosts that fail it.
"""

import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

from common.errors import UsageError
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher.commands import DataServer

READY = 'ready at'
_STOP_TIMEOUT = 15


class DataServers:
  """`servers`, running; `log` gets the launcher's lines about them."""

  def __init__(self, servers: List[DataServer],
               log: Callable[[str], None]):
    self._servers = servers
    self._log = log
    self._processes: List[Optional[subprocess.Popen]] = [None] * len(servers)
    self._ready = [threading.Event() for _ in servers]
    self._last_line = [''] * len(servers)
    # What each server reported of itself (commands.PID_LINE): the only
    # process its stop may end.
    self._pids: List[Optional[Tuple[str, str]]] = [None] * len(servers)
    self._stopping = False
    self._left_out = set()  # Indices of servers whose host failed a check.
    self.lost: List[DataServer] = []

  def start(self, timeout: float = 120) -> 'DataServers':
    """Starts every server and waits until each says it is ready."""
    for i in range(len(self._servers)):
      # Workers register with the dispatcher: it goes first.
      self._launch(i, timeout)
    return self

  def _launch(self, i: int, timeout: float) -> None:
    self._ready[i] = threading.Event()
    self._pids[i] = None
    self._processes[i] = subprocess.Popen(
        self._servers[i].argv, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    follower = threading.Thread(target=self._follow, args=(i,), daemon=True)
    follower.start()
    self._await(i, timeout, follower)

  @property
  def num_workers(self) -> int:
    """Data workers serving (or to be restarted): not left out."""
    return sum(1 for i, server in enumerate(self._servers)
               if server.role == 'worker' and i not in self._left_out)

  def renew(self, ready_hosts, timeout: float = 120) -> List[str]:
    """Before the job restarts: each lost server started again if its
    host is in `ready_hosts` (the dispatcher from its journal), each data
    worker of a host that is not left out. Returns one line per change;
    raises UsageError if the dispatcher's host is not ready (its journal
    lives there)."""
    lines = []
    for i, server in enumerate(self._servers):
      if i in self._left_out:
        continue
      if server.host not in ready_hosts:
        if server.role == 'dispatcher':
          raise UsageError(f'the tf.data service dispatcher\'s host '
                           f'{server.host} fails the pre-flight check, and '
                           'its journal (--data_service_work_dir) is there')
        self._left_out.add(i)
        if self._processes[i].poll() is None:
          self._processes[i].kill()  # Its ssh session; the host is away.
        lines.append(f'the tf.data service data worker on {server.host} is '
                     'left out: its host fails the pre-flight check')
      elif server in self.lost:
        self.lost.remove(server)
        self._launch(i, timeout)
        lines.append(f'restarted the tf.data service {server.role} on '
                     f'{server.host}')
    return lines

  def _await(self, i: int, timeout: float,
             follower: threading.Thread) -> None:
    server, deadline = self._servers[i], time.monotonic() + timeout
    while not self._ready[i].wait(0.2):
      exited = self._processes[i].poll() is not None
      if exited or time.monotonic() > deadline:
        if exited:
          follower.join(timeout=5)  # Its last line, read to the end.
        self.stop()
        # Its own one-line error, as the cause of the launcher's.
        said = self._last_line[i].removeprefix('error: ')
        why = (f'exited: {said}' if exited
               else f'not ready within {timeout:.0f} s')
        raise UsageError(f'the tf.data service {server.role} on '
                         f'{server.host} did not start ({why}); nothing '
                         'else was started')

  def _follow(self, i: int) -> None:
    """Passes server i's output through and notes its readiness and exit."""
    server, process = self._servers[i], self._processes[i]
    for line in process.stdout:
      line = line.rstrip('\n')
      pid = self._pids[i] is None and launch.read_pid_line(line)
      if pid:
        self._pids[i] = pid
        continue
      if line.strip():
        self._last_line[i] = line.strip()
      if READY in line:
        self._ready[i].set()
      sys.stdout.write(f'[data {server.role} {server.host}] {line}\n')
      sys.stdout.flush()
    code = process.wait()
    if (self._stopping or i in self._left_out or
        not self._ready[i].is_set()):
      return
    self.lost.append(server)
    if server.role == 'dispatcher':
      self._log(f'the tf.data service dispatcher on {server.host} exited '
                f'(code {code}): training waits for a dispatcher restarted '
                'with the same --work_dir, up to --tf_data_service_timeout')
    else:
      left = sum(1 for s in self._servers
                 if s.role == 'worker' and s not in self.lost)
      self._log(f'the tf.data service data worker on {server.host} exited '
                f'(code {code}); training goes on with {left} data '
                f'worker{"" if left == 1 else "s"}')

  def lost_hosts(self) -> List[str]:
    return sorted({server.host for server in self.lost})

  def stop(self) -> None:
    """Ends every server: its ssh session, then the process it reported
    on its host, if that outlived it (never another process there)."""
    self._stopping = True
    for process in self._processes:
      if process is not None and process.poll() is None:
        process.terminate()
    for i, (server, process) in enumerate(zip(self._servers,
                                              self._processes)):
      if process is None or i in self._left_out:
        continue
      try:
        if self._pids[i]:  # None: it never started there.
          subprocess.run(server.stop_argv(*self._pids[i]),
                         stdin=subprocess.DEVNULL, capture_output=True,
                         timeout=_STOP_TIMEOUT)
      except subprocess.TimeoutExpired:
        self._log(f'could not reach {server.host} to stop its tf.data '
                  f'service {server.role}: stop it there')
      try:
        process.wait(timeout=_STOP_TIMEOUT)
      except subprocess.TimeoutExpired:
        process.kill()
