"""What an attempt of a job runs (Attempt) and, when it fails, why, in one
line (Failure, describe_failure, advice): read from the exit code and the
last lines of mpirun's output, with what a scheduler's own launcher says
(LauncherOutput, which a placement extends). supervisor.py runs the
attempts; the placements and job.py need only these names.

mpirun's own account of a failure is several lines of boilerplate far from
the end of the log, and when a host is lost it names only a daemon: the
line here says which rank or host was lost and what to do.
"""

import dataclasses
import re
import signal
from typing import Mapping, Optional, Sequence, Tuple

from common.errors import NON_FINITE_EXIT_CODE, STUCK_EXIT_CODE, UsageError

# Exit codes of failures a rerun cannot fix: bad input and a non-finite loss.
NOT_RETRIED_EXIT_CODES = (UsageError.exit_code, NON_FINITE_EXIT_CODE)

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
# A worker's line as it ends itself, waiting on a frozen or stuck one
# (resnet_keras/training/watchdog.py).
_STUCK = re.compile(r"worker (\d+): the job's collectives have not moved "
                    r'for (\d+) s')


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
                   f'{signal_name(int(signum))}', retry=True)
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


def signal_name(signum: int) -> str:
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
    return f' ({signal_name(exit_code - 128)})'
  return ''


def advice(failure: Failure, restarts_left: int) -> str:
  if not failure.retry:
    return 'fix the cause and rerun'
  if restarts_left:
    return 'restarting from the last checkpoint'
  return ('check that host and rerun the same command: training resumes from '
          'the last checkpoint (--max_restarts N restarts by itself)')
