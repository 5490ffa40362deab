"""Runs a training job to its end: output passed through, the cause of a
failure named in one line (failures.py names it), and (--max_restarts) the
whole job started again.

The supervisor reads mpirun's output as it passes through, and when the job
fails prints one line of ours last: which rank or host was lost and what to
do.
Restarting relaunches the same command, or with `replan` (an elastic job,
demo_resnet_keras.py --min_hosts) the command for the hosts that pass a
new check; the workers resume from the chief's last checkpoint like any
rerun.

An elastic job that runs on fewer hosts than planned also grows back
without a failure (regrowth.py): once a dropped host may rejoin, the
workers save at the next step boundary and stop, and the next attempt,
replanned, takes the host back. Such a stop does not count against
--max_restarts.
"""

import collections
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple

from common import worker_contract
from common.errors import (STOPPED_AT_WARNING_EXIT_CODE, WARNING_SIGNAL,
                           UsageError)
from resnet_keras.launcher import failures
from resnet_keras.launcher import regrowth

_TAIL_LINES = 400
# Linux's prctl option: a signal the kernel sends a process when the thread
# that started it dies.
_PR_SET_PDEATHSIG = 1
_LIBC = (ctypes.CDLL(None, use_errno=True)
         if sys.platform.startswith('linux') else None)

# mpirun has begun to take the job down: a rank failed, or a host's daemon
# stopped answering (it "will terminate the job", and with two of three
# hosts cut it then waited on them as it does after a rank's failure).
_ABORTING = re.compile(r'the job has been aborted|mpirun noticed that process'
                       r'|ORTE has lost communication with a remote daemon')
# The chief's line once the run's summary is written: the job's work is
# done, and its workers only have to leave.
_FINISHED = re.compile(r' I run summary: ')
# The least time the workers get to leave after the chief finished before
# the supervisor ends them (TensorFlow's teardown on a busy host).
_LEAVE_GRACE = 30
class Supervisor:
  """Runs `attempt` up to 1 + max_restarts times; see the module docstring.

  `replan(failure)`, if given, returns the next attempt after a failure a
  rerun can fix (None: a stop for the job to grow back), or raises
  UsageError (its message logged) to end the job. `abort_grace`: seconds
  mpirun gets to end the job once it says it is aborting it (0: no limit),
  and the least the workers get to leave once the chief finished (_Run).
  `regrowth()`, if given, names a dropped host that may rejoin (None: none
  may; regrowth.py); with `replan` the job grows back.
  """

  def __init__(self, attempt: failures.Attempt, *, max_restarts: int,
               workers_per_host: int, parse_output: bool,
               log: Callable[[str], None],
               replan: Optional[Callable[[Optional[failures.Failure]],
                                         failures.Attempt]] = None,
               abort_grace: float = 0,
               launcher_output: Optional[failures.LauncherOutput] = None,
               regrowth_check: Optional[Callable[[], Optional[str]]] = None):
    if max_restarts < 0:
      raise UsageError(f'--max_restarts must be >= 0, got {max_restarts}')
    self._attempt = attempt
    self._replan = replan
    self._abort_grace = abort_grace
    self._max_restarts = max_restarts
    self._workers_per_host = workers_per_host
    self._parse_output = parse_output
    self._launcher_output = launcher_output or failures.LauncherOutput()
    self._log = log
    self._run: Optional[_Run] = None  # The attempt running, or the last.
    self._watchers: List[regrowth.Watcher] = []
    self._stopped_by: Optional[int] = None
    self._warned = False  # The warning signal came to the launcher.
    self._job_identity = worker_contract.new_job_identity(os.environ)
    self._regrowth_check = regrowth_check if replan else None

  def run(self) -> int:
    """The job's exit code (that of its last attempt)."""
    previous = {sig: signal.signal(sig, self._forward)
                for sig in (signal.SIGTERM, signal.SIGINT, WARNING_SIGNAL)}
    try:
      return self._attempts()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
      for watcher in self._watchers:
        watcher.join()

  def _attempts(self) -> int:
    restarts = regrowths = 0
    while True:
      started = time.monotonic()
      exit_code, tail = self._run_once(restarts + regrowths)
      if exit_code == 0 or self._run.ended_after_finish:
        return 0
      failure = failures.describe_failure(exit_code, tail, self._attempt.hosts,
                                          self._workers_per_host,
                                          self._launcher_output)
      stopped_at_warning = STOPPED_AT_WARNING_EXIT_CODE in (
          exit_code, failure.first_exit_code)
      if (stopped_at_warning and self._watchers[-1:] and
          self._watchers[-1].stopped_job and not self._warned and
          self._stopped_by is None):
        regrowths += 1  # The workers saved and stopped: the job grows.
        failure = None
      # A scheduler's warning: the workers saved; the caller has the job
      # resumed where the scheduler says, it is not restarted here.
      elif stopped_at_warning:
        return STOPPED_AT_WARNING_EXIT_CODE
      elif self._stopped_by is not None:  # The user stopped us: no retry.
        self._log(f'job stopped by {failures.signal_name(self._stopped_by)} '
                  f'to the launcher (exit {exit_code})' +
                  self._launcher_output.stopped_note('\n'.join(tail),
                                                     failure))
        return exit_code
      else:
        left = self._max_restarts - restarts if failure.retry else 0
        self._log(f'job failed after {time.monotonic() - started:.0f} s (exit '
                  f'{exit_code}): {failure.cause}; '
                  f'{failures.advice(failure, left)}')
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

  def _run_once(self, attempts: int):
    """One attempt (`attempts` before it): its exit code and last lines."""
    env = {**self._attempt.env,
           **worker_contract.attempt_env(attempts, self._attempt.resume_step,
                                         self._job_identity)}
    self._run = _Run(list(self._attempt.argv), env, self._parse_output,
                     self._abort_grace, self._log)
    watcher = None
    if self._regrowth_check:
      watcher = regrowth.Watcher(self._regrowth_check, self._run.job,
                                 self._log, lambda: not self._warned)
      self._watchers.append(watcher)
    try:
      return self._run.wait()
    finally:
      if watcher:
        watcher.end()

  def _forward(self, signum, frame):  # pylint: disable=unused-argument
    if signum == WARNING_SIGNAL:  # The workers stop at it and save.
      self._warned = True
    else:
      self._stopped_by = signum
    if self._run is not None:
      self._run.send_signal(signum)


class _Run:
  """One attempt's process, started at once: its output passed through (its
  last lines kept, when `parse_output`), and ended when it outlives
  `abort_grace` after mpirun began to abort it, or after the chief
  finished the run.

  mpirun waits for the daemon of a host that stopped answering to confirm
  each rank's end, and a daemon whose link was cut while mpirun was writing
  to it holds the job for TCP's retransmission timeout (~15 min), which
  mpirun's keepalive probes do not shorten. Once the chief says the run is
  finished (its summary written), the workers get `abort_grace` (at least
  _LEAVE_GRACE) seconds to leave; a worker stuck or frozen after the
  chief's last collective (Horovod's ranks leave without one) would
  otherwise hold mpirun (or a scheduler's launcher) forever. The job is
  then ended, and it succeeded (`ended_after_finish`).
  """

  def __init__(self, argv: List[str], env: Dict[str, str], parse_output: bool,
               abort_grace: float, log: Callable[[str], None]):
    self._parse_output, self._abort_grace, self._log = (
        parse_output, abort_grace, log)
    self.ended_after_finish = False
    if not parse_output:
      self.job = subprocess.Popen(argv, env=env)
    else:
      # A session of its own: ending it ends mpirun's ssh sessions too.
      self.job = subprocess.Popen(argv, env=env,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT,
                                  start_new_session=True,
                                  preexec_fn=_ends_with(os.getpid()))

  def wait(self) -> Tuple[int, List[str]]:
    """The exit code (a signal's as a shell reports it: 128 + signal) and
    the last lines."""
    tail: Deque[str] = collections.deque(maxlen=_TAIL_LINES)
    if self._parse_output:
      _pass_through(self.job, tail, self._abort_grace, self._end_job,
                    self._end_finished_job)
    exit_code = self.job.wait()
    return (128 - exit_code if exit_code < 0 else exit_code), list(tail)

  def send_signal(self, signum: int) -> None:
    if self.job.poll() is None:
      self.job.send_signal(signum)

  def _end_job(self) -> None:
    """mpirun, its ssh sessions and local ranks ended (SIGTERM, then
    SIGKILL): they outlived abort_grace after mpirun began to abort. mpirun
    may have exited already: its ssh session to a host whose link was cut
    lives on and holds the job's output open, and the launcher, reading it,
    would wait for TCP to give up on that host (~15 min)."""
    if not _session_ended(self.job):
      self._log(f'mpirun did not end the job within {self._abort_grace:.0f} '
                's of aborting it (a host stopped answering): ending mpirun')
      _end_session(self.job)

  def _end_finished_job(self) -> None:
    """The job ended (SIGTERM, then SIGKILL) once the chief finished the
    run and the workers outlived their grace to leave."""
    if _session_ended(self.job):
      return
    self.ended_after_finish = True
    grace = max(self._abort_grace, _LEAVE_GRACE)
    self._log(f'the chief finished the run (run_summary.json written), but '
              f'{grace:.0f} s later the job had not ended: a worker is stuck '
              'or frozen; ending the job (its results are complete)')
    _end_session(self.job)


def _pass_through(job: subprocess.Popen, tail: Deque[str],
                  abort_grace: float, end_job: Callable[[], None],
                  end_finished_job: Callable[[], None]) -> None:
  """The job's output copied to ours as it comes, its last lines kept in
  `tail`; `end_job` called `abort_grace` s after mpirun says it aborts the
  job (0: never), `end_finished_job` the workers' grace to leave after the
  chief's summary line, each unless the output ends first."""
  timers = {}
  for raw in job.stdout:
    sys.stdout.buffer.write(raw)
    sys.stdout.flush()
    tail.append(raw.decode(errors='replace').rstrip('\n'))
    if 'abort' not in timers and abort_grace and _ABORTING.search(tail[-1]):
      timers['abort'] = _start_timer(abort_grace, end_job)
    if 'finish' not in timers and _FINISHED.search(tail[-1]):
      timers['finish'] = _start_timer(max(abort_grace, _LEAVE_GRACE),
                                      end_finished_job)
  for timer in timers.values():
    timer.cancel()


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
  model_dir while a rerun writes it too (found by testbed/soak/); SIGTERM
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
