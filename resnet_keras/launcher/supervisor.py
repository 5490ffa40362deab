"""Runs a training job to its end: output passed through, the cause of a
failure named in one line, and (--max_restarts) the whole job started again.

mpirun's own account of a failure is several lines of boilerplate far from
the end of the log, and when a host is lost it names only a daemon. The
supervisor reads mpirun's output as it passes through, and when the job fails
prints one line of ours last: which rank or host was lost and what to do.
Restarting relaunches the same command, or with `replan` (an elastic job,
demo_resnet_keras.py --min_hosts) the command for the hosts that pass a
new check; the workers resume from the chief's last checkpoint like any
rerun.
"""

import collections
import ctypes
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Deque, List, Mapping, Optional, Sequence, Tuple

from common import worker_contract
from common.errors import (NON_FINITE_EXIT_CODE, STOPPED_AT_WARNING_EXIT_CODE,
                           STUCK_EXIT_CODE, WARNING_SIGNAL, UsageError)

# Exit codes of failures a rerun cannot fix: bad input and a non-finite loss.
NOT_RETRIED_EXIT_CODES = (UsageError.exit_code, NON_FINITE_EXIT_CODE)
_TAIL_LINES = 400
# Linux's prctl option: a signal the kernel sends a process when the thread
# that started it dies.
_PR_SET_PDEATHSIG = 1
_LIBC = (ctypes.CDLL(None, use_errno=True)
         if sys.platform.startswith('linux') else None)

_RANK_SIGNAL = re.compile(
    r'process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)')
_RANK_EXIT = re.compile(r'Process name:\s+\[\[\d+,\d+\],(\d+)\]')
_EXIT_CODE = re.compile(r'Exit code:\s+(\d+)')
_LOST_DAEMON = re.compile(r'Remote daemon:\s+\[\[\d+,\d+\],\d+\] on node (\S+)')
_HOST_OF_RANK = re.compile(r'on node (\S+)')
# ssh's word when a host's processes (its sshd session among them) die.
_SSH_CLOSED = re.compile(r'Connection to (\S+) closed by remote host')
# An MPI rank whose peer vanished (OpenMPI's TCP transport).
_PEER_GONE = re.compile(r'Peer host:\s+(\S+)')
# mpirun has begun to take the job down: a rank failed, or a host's daemon
# stopped answering (it "will terminate the job", and with two of three
# hosts cut it then waited on them as it does after a rank's failure).
_ABORTING = re.compile(r'the job has been aborted|mpirun noticed that process'
                       r'|ORTE has lost communication with a remote daemon')
# A worker's line as it ends itself, waiting on a frozen or stuck one
# (resnet_keras/watchdog.py).
_STUCK = re.compile(r"worker (\d+): the job's collectives have not moved "
                    r'for (\d+) s')
# The chief's line once the run's summary is written: the job's work is
# done, and its workers only have to leave.
_FINISHED = re.compile(r' I run summary: ')
# The least time the workers get to leave after the chief finished before
# the supervisor ends them (TensorFlow's teardown on a busy host).
_LEAVE_GRACE = 30


@dataclasses.dataclass(frozen=True)
class Failure:
  """Why a job ended badly, as far as its output tells."""
  exit_code: int
  cause: str  # One phrase: what was lost.
  retry: bool  # Whether starting the job again can help.
  # The exit code of the rank that ended first, where the output names it:
  # the launcher (mpirun, a scheduler's) ends the others, which then exit
  # otherwise.
  first_exit_code: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Attempt:
  """What one attempt runs: its command, environment, the hosts it runs
  on (empty: this host), in mpirun's order, and for a restart the step of
  the checkpoint it resumes at (0: none yet; None: not a restart)."""
  argv: Sequence[str]
  env: Mapping[str, str]
  hosts: Sequence[str] = ()
  resume_step: Optional[int] = None


class LauncherOutput:
  """What the supervisor reads in the output of the program that starts
  the workers, beyond mpirun's own lines (which it always knows): a
  scheduler's own launcher says in its own words that it lost a node,
  or which task exited first. A placement gives its own (placement.py:
  `Placement.launcher_output`); this one adds nothing."""

  def lost_node(self, text: str, hosts: Sequence[str],
                workers_per_host: int) -> str:
    """The cause, in one phrase, where the output names a node as lost
    ('': it names none). A rerun can help."""
    del text, hosts, workers_per_host
    return ''

  def first_task_exit(self, text: str
                      ) -> Optional[Tuple[Optional[str], int, int]]:
    """(host, rank, exit code) of the first task the output says exited
    with an error (None: it says none)."""
    del text
    return None

  def stopped_note(self, text: str, failure: Failure) -> str:
    """What to add to the line of a job the launcher was signalled to stop
    (a scheduler ending the job says why here; '': nothing)."""
    del text, failure
    return ''


def describe_failure(exit_code: int, output: Sequence[str],
                     hosts: Sequence[str], workers_per_host: int,
                     launcher_output: Optional['LauncherOutput'] = None
                     ) -> Failure:
  """The cause of a failed job from its exit code and last output lines.

  `hosts` and `workers_per_host` give the layout mpirun used (empty hosts:
  this host only), to name the ranks on a lost host. `launcher_output`
  reads what a scheduler's own launcher says, beside mpirun's lines.
  """
  text = '\n'.join(output)
  launcher_output = launcher_output or LauncherOutput()
  lost_node = launcher_output.lost_node(text, hosts, workers_per_host)
  if lost_node:
    return Failure(exit_code, lost_node, retry=True)
  lost = _LOST_DAEMON.search(text) or _SSH_CLOSED.search(text)
  if lost:
    host = lost.group(1)
    ranks = ranks_on(host, hosts, workers_per_host)
    return Failure(exit_code, f'lost contact with host {host}{ranks}: it '
                   'went down, its network failed, or its processes were '
                   'killed', retry=True)
  stuck = _stuck_worker(text, len(hosts) * workers_per_host)
  if stuck:
    return Failure(exit_code, stuck, retry=True,
                   first_exit_code=STUCK_EXIT_CODE)
  by_signal = _RANK_SIGNAL.search(text)
  if by_signal:
    rank, host, signum = by_signal.groups()
    return Failure(exit_code, f'rank {rank} on host {host} was killed by '
                   f'{_signal_name(int(signum))}', retry=True)
  peer = _PEER_GONE.search(text)
  if peer:
    host = peer.group(1)
    return Failure(exit_code, f'lost contact with host {host}'
                   f'{ranks_on(host, hosts, workers_per_host)}: a rank '
                   'there died or its network failed', retry=True)
  first = _RANK_EXIT.search(text)
  code = _EXIT_CODE.search(text)
  task = launcher_output.first_task_exit(text)
  if (first and code) or task:
    if task:
      host, rank, rank_code = task
    else:
      rank, rank_code = int(first.group(1)), int(code.group(1))
      host = _HOST_OF_RANK.search(text[first.end():])
      host = host and host.group(1)
    where = f' on host {host}' if host else ''
    return Failure(exit_code, f'rank {rank}{where} exited with code '
                   f'{rank_code}{_meaning(rank_code)}',
                   retry=rank_code not in NOT_RETRIED_EXIT_CODES,
                   first_exit_code=rank_code)
  return Failure(exit_code, f'the job exited with code {exit_code}'
                 f'{_meaning(exit_code)}',
                 retry=exit_code not in NOT_RETRIED_EXIT_CODES)


def _stuck_worker(text: str, workers: int) -> Optional[str]:
  """The cause where workers ended themselves waiting on another: the
  worker that did not say so is the one they waited on (where the number
  of workers is known: 0 for this host's)."""
  found = _STUCK.findall(text)
  if not found:
    return None
  waited = max(int(seconds) for _, seconds in found)
  silent = sorted(set(range(workers)) - {int(w) for w, _ in found})
  frozen = (f'worker {", ".join(map(str, silent))}' if silent and
            len(silent) < workers else 'a worker')
  return (f'{frozen} was frozen or stuck: the others waited {waited} s on '
          'the job\'s collectives, then ended themselves')


def ranks_on(host: str, hosts: Sequence[str], workers_per_host: int) -> str:
  if host not in hosts:
    return ''
  first = list(hosts).index(host) * workers_per_host
  ranks = range(first, first + workers_per_host)
  return f' (rank{"s" if len(ranks) > 1 else ""} ' + \
      ', '.join(map(str, ranks)) + ')'


def _signal_name(signum: int) -> str:
  try:
    return f'{signal.Signals(signum).name} ({signum})'
  except ValueError:
    return f'signal {signum}'


def _meaning(exit_code: int) -> str:
  if exit_code == UsageError.exit_code:
    return ' (a usage error: see its error line above)'
  if exit_code == NON_FINITE_EXIT_CODE:
    return ' (a non-finite loss: see its line above)'
  if exit_code == STUCK_EXIT_CODE:
    return (' (it waited too long on a frozen or stuck worker: see its line '
            'above)')
  if 128 < exit_code <= 128 + 64:
    return f' ({_signal_name(exit_code - 128)})'
  return ''


def advice(failure: Failure, restarts_left: int) -> str:
  if not failure.retry:
    return 'fix the cause and rerun'
  if restarts_left:
    return 'restarting from the last checkpoint'
  return ('check that host and rerun the same command: training resumes from '
          'the last checkpoint (--max_restarts N restarts by itself)')


class Supervisor:
  """Runs `attempt` up to 1 + max_restarts times; see the module docstring.

  `replan(failure)`, if given, returns the next attempt after a failure a
  rerun can fix, or raises UsageError (its message logged) to end the job.
  `abort_grace`: seconds mpirun gets to end the job once it says it is
  aborting it, before the supervisor ends mpirun (0: no limit). mpirun
  waits for the daemon of a host that stopped answering to confirm each
  rank's end, and a daemon whose link was cut while mpirun was writing to
  it holds the job for TCP's retransmission timeout (~15 min), which
  mpirun's keepalive probes do not shorten.
  Once the chief says the run is finished (its summary written), the
  workers get `abort_grace` (at least _LEAVE_GRACE) seconds to leave; a
  worker stuck or frozen after the chief's last collective (Horovod's
  ranks leave without one) would otherwise hold mpirun (or a scheduler's
  launcher) forever.
  The supervisor then ends the job, says so, and the job succeeded.
  """

  def __init__(self, attempt: Attempt, *, max_restarts: int,
               workers_per_host: int, parse_output: bool,
               log: Callable[[str], None],
               replan: Optional[Callable[[Failure], Attempt]] = None,
               abort_grace: float = 0,
               launcher_output: Optional[LauncherOutput] = None):
    if max_restarts < 0:
      raise UsageError(f'--max_restarts must be >= 0, got {max_restarts}')
    self._attempt = attempt
    self._replan = replan
    self._abort_grace = abort_grace
    self._max_restarts = max_restarts
    self._workers_per_host = workers_per_host
    self._parse_output = parse_output
    self._launcher_output = launcher_output or LauncherOutput()
    self._log = log
    self._job: Optional[subprocess.Popen] = None
    self._stopped_by: Optional[int] = None
    self._ended_after_finish = False
    self._job_identity = worker_contract.new_job_identity(os.environ)

  def run(self) -> int:
    """The job's exit code (that of its last attempt)."""
    previous = {sig: signal.signal(sig, self._forward)
                for sig in (signal.SIGTERM, signal.SIGINT, WARNING_SIGNAL)}
    try:
      return self._attempts()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)

  def _attempts(self) -> int:
    restarts = 0
    while True:
      started = time.monotonic()
      exit_code, tail = self._run_once(restarts)
      if exit_code == 0 or self._ended_after_finish:
        return 0
      failure = describe_failure(exit_code, tail, self._attempt.hosts,
                                 self._workers_per_host,
                                 self._launcher_output)
      # A scheduler's warning: the workers saved; the caller has the job
      # resumed where the scheduler says, it is not restarted here.
      if STOPPED_AT_WARNING_EXIT_CODE in (exit_code, failure.first_exit_code):
        return STOPPED_AT_WARNING_EXIT_CODE
      if self._stopped_by is not None:  # The user stopped us: never retried.
        self._log(f'job stopped by {_signal_name(self._stopped_by)} to the '
                  f'launcher (exit {exit_code})' +
                  self._launcher_output.stopped_note('\n'.join(tail),
                                                     failure))
        return exit_code
      left = self._max_restarts - restarts if failure.retry else 0
      self._log(f'job failed after {time.monotonic() - started:.0f} s (exit '
                f'{exit_code}): {failure.cause}; {advice(failure, left)}')
      if not left:
        return exit_code
      restarts += 1
      self._log(f'restart {restarts} of {self._max_restarts}: '
                f'{failure.cause}')
      if self._replan:
        try:
          self._attempt = self._replan(failure)
        except UsageError as e:
          self._log(str(e))
          return exit_code

  def _run_once(self, restarts: int):
    argv = list(self._attempt.argv)
    step = self._attempt.resume_step
    env = {**self._attempt.env,
           **worker_contract.attempt_env(restarts, step, self._job_identity)}
    tail: Deque[str] = collections.deque(maxlen=_TAIL_LINES)
    self._ended_after_finish = False
    if not self._parse_output:
      self._job = subprocess.Popen(argv, env=env)
    else:
      # A session of its own: ending it ends mpirun's ssh sessions too.
      self._job = subprocess.Popen(argv, env=env,
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT,
                                   start_new_session=True,
                                   preexec_fn=_ends_with(os.getpid()))
      timers = {}
      for raw in self._job.stdout:
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        tail.append(raw.decode(errors='replace').rstrip('\n'))
        if ('abort' not in timers and self._abort_grace and
            _ABORTING.search(tail[-1])):
          timers['abort'] = _start_timer(self._abort_grace, self._end_job)
        if 'finish' not in timers and _FINISHED.search(tail[-1]):
          timers['finish'] = _start_timer(
              max(self._abort_grace, _LEAVE_GRACE), self._end_finished_job)
      for timer in timers.values():
        timer.cancel()
    exit_code = self._job.wait()
    # A job killed by a signal exits as a shell reports it: 128 + signal.
    return (128 - exit_code if exit_code < 0 else exit_code), list(tail)

  def _end_job(self) -> None:
    """mpirun, its ssh sessions and local ranks ended (SIGTERM, then
    SIGKILL): they outlived abort_grace after mpirun began to abort. mpirun
    may have exited already: its ssh session to a host whose link was cut
    lives on and holds the job's output open, and the launcher, reading it,
    would wait for TCP to give up on that host (~15 min)."""
    if not self._job_ended():
      self._log(f'mpirun did not end the job within {self._abort_grace:.0f} '
                's of aborting it (a host stopped answering): ending mpirun')
      _end_session(self._job)

  def _end_finished_job(self) -> None:
    """The job ended (SIGTERM, then SIGKILL) once the chief finished the
    run and the workers outlived their grace to leave."""
    if self._job_ended():
      return
    self._ended_after_finish = True
    grace = max(self._abort_grace, _LEAVE_GRACE)
    self._log(f'the chief finished the run (run_summary.json written), but '
              f'{grace:.0f} s later the job had not ended: a worker is stuck '
              'or frozen; ending the job (its results are complete)')
    _end_session(self._job)

  def _job_ended(self) -> bool:
    return self._job is None or _session_ended(self._job)

  def _forward(self, signum, frame):  # pylint: disable=unused-argument
    if signum != WARNING_SIGNAL:  # The workers stop at it and save.
      self._stopped_by = signum
    if self._job is not None and self._job.poll() is None:
      self._job.send_signal(signum)


def _session_ended(job: subprocess.Popen) -> bool:
  return job.poll() is not None and not session_processes(job.pid)


def _end_session(job: subprocess.Popen) -> None:
  """`job`'s session ended: SIGTERM, then SIGKILL to what is left 5 s
  later."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    _signal_session(job.pid, sig)
    deadline = time.monotonic() + 5
    while not _session_ended(job) and time.monotonic() < deadline:
      time.sleep(0.1)
    if _session_ended(job):
      return


def _start_timer(seconds: float, action: Callable[[], None]
                 ) -> threading.Timer:
  timer = threading.Timer(seconds, action)
  timer.daemon = True
  timer.start()
  return timer


def _ends_with(launcher: int) -> Callable[[], None]:
  """What mpirun runs before it starts: SIGTERM to it once the launcher
  dies. A launcher killed (kill -9, the OOM killer) would otherwise leave
  mpirun, in a session of its own, training on unsupervised and writing
  model_dir while a rerun writes it too (found by testbed/soak.py); SIGTERM
  has the workers save and stop, as the launcher's own SIGTERM does."""
  def preexec() -> None:
    if _LIBC is not None:
      _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher:  # It died before the prctl.
      os.kill(os.getpid(), signal.SIGTERM)
  return preexec


def session_processes(session_id: int) -> List[int]:
  """The live processes of a session (from /proc; none where it is absent).

  mpirun's job is ended by its session, not its process group: OpenMPI puts
  each ssh session to a remote daemon and each local rank in a process
  group of its own, and one of those left alive (an ssh to a host whose
  link was cut) holds mpirun's output open, so the launcher waits with it.
  """
  found = []
  for name in os.listdir('/proc') if os.path.isdir('/proc') else ():
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/stat') as f:
        # After the command (in parentheses): state, ppid, pgrp, session.
        state, _, _, session = f.read().rsplit(')', 1)[1].split()[:4]
    except (OSError, ValueError):
      continue
    if state != 'Z' and int(session) == session_id:
      found.append(int(name))
  return found


def _signal_session(session_id: int, sig: int) -> None:
  """`sig` to the process group of a session's leader (all there is to
  reach where there is no /proc) and to every process of the session."""
  try:
    os.killpg(session_id, sig)
  except ProcessLookupError:
    pass
  for pid in session_processes(session_id):
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      pass
