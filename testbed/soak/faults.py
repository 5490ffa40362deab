"""What each fault of the soak's catalogue (plan.CATALOGUE) does to a
running job (runner.py), and what shows that it landed: never the
call's own word, but the world after it (the process gone or stopped, the
link down, the file system full, Slurm's state) or, where only the job can
tell, the line it must log (`confirm`)."""

import os
import re
import signal
import time
from typing import List, NamedTuple, Optional, Sequence, Tuple

from testbed.soak import evidence
from testbed.soak.invariants import FaultRecord, JobRecord
from testbed.soak.jobs import Processes, slurm_field
from testbed.soak.plan import JobPlan

# Seconds a fault's effect may take to show (a signal delivered, a process
# reaped, Slurm's state changed) before the soak calls it not landed.
SHOW_SECONDS = 5
# Free bytes left on a file system the soak filled: less than any
# checkpoint of the soak's model takes.
FULL_BYTES = 1 << 20
GONE = ('', 'Z')  # process_state's answers once a process has ended.
STOPPED = ('T',)
# The lines that show a fault landed where only the job can tell: the
# launcher's own on SIGTERM, and the workers' save at Slurm's warning (or a
# rank ended by the signal itself, before its handler was up).
STOPPED_BY_SIGTERM = r'job stopped by SIGTERM'
WARNED = r'signalled \(SIGUSR1\)|SIGUSR1 \(10\)'


class Landing(NamedTuple):
  """What a fault did and what showed it landed (landed None: the line in
  `awaits` decides, once the job ended)."""
  did: str
  landed: Optional[bool]
  evidence: str
  awaits: str = ''


def _describe(state: str) -> str:
  return {'': 'gone', 'Z': 'ended (not yet reaped)', 'T': 'stopped'}.get(
      state, f'still in state {state}')


def _signal_rank(processes: Processes, plan: JobPlan, sig: int,
                 wanted: Tuple[str, ...]) -> Landing:
  pid, did = processes.signal_rank(plan, sig)
  if pid is None:
    return Landing(did, False, did)
  state = evidence.wait_for(lambda: evidence.process_state(pid),
                            lambda state: state in wanted, SHOW_SECONDS)
  return Landing(did, state in wanted, f'pid {pid} {_describe(state)}')


def _signal_launcher(job, sig: int) -> Optional[str]:
  """Why `sig` could not reach the launcher (None: sent)."""
  if job.poll() is not None:
    return f'the launcher had already ended (exit {job.returncode})'
  job.send_signal(sig)
  return None


def _kill_launcher(job) -> Landing:
  did = f'pid {job.pid}'
  refused = _signal_launcher(job, signal.SIGKILL)
  if refused:
    return Landing(did, False, refused)
  code = evidence.wait_for(job.poll, lambda code: code is not None,
                           SHOW_SECONDS)
  return Landing(did, code == -signal.SIGKILL,
                 f'the launcher ended with {code}')


def _cut(cluster, host, timers: List, heal_after: Optional[float]) -> Landing:
  cluster.cut_link(host)
  if heal_after is not None:
    timers.append((time.monotonic() + heal_after,
                   lambda: cluster.restore_link(host)))
  up = cluster.link_up(host)
  return Landing(host.name, not up,
                 f"{host.name}'s link {'still up' if up else 'down'}")


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _fill(model_dir: str, timers: List) -> Landing:
  parent = os.path.dirname(model_dir)
  filler = os.path.join(parent, 'filler')
  did = f'{filler} fills {parent}'
  timers.append((time.monotonic() + 10, lambda: _remove(filler)))
  try:
    with open(filler, 'wb') as f:
      free = os.statvfs(parent)
      os.posix_fallocate(f.fileno(), 0, max(
          1, free.f_bavail * free.f_frsize - 32 * 1024))
  except OSError as e:
    return Landing(did, False, f'fallocate: {e}')
  stats = os.statvfs(parent)
  left = stats.f_bavail * stats.f_frsize
  return Landing(did, left < FULL_BYTES, f'{left} bytes left on {parent}')


def _truncate_newest(model_dir: str) -> Tuple[Optional[str], List[str]]:
  """(the newest checkpoint's prefix, its files cut to half)."""
  from resnet_keras.rundir import run_directory  # pylint: disable=g-import-not-at-top
  latest = run_directory.latest_checkpoint(model_dir)
  if latest is None:
    return None, []
  names = [n for n in os.listdir(model_dir)
           if n.startswith(os.path.basename(latest.prefix) + '.')]
  for name in names:
    path = os.path.join(model_dir, name)
    os.truncate(path, os.path.getsize(path) // 2)
  return latest.prefix, names


def _kill_and_truncate(processes: Processes, plan: JobPlan, model_dir: str,
                       record: JobRecord) -> Landing:
  from resnet_keras.rundir import checkpoints  # pylint: disable=g-import-not-at-top
  killed = _signal_rank(processes, plan, signal.SIGKILL, GONE)
  prefix, record.truncated = _truncate_newest(model_dir)
  did = (f'{killed.did}; truncated '
         f'{", ".join(record.truncated) or "nothing"}')
  if prefix is None:
    return Landing(did, False, f'{killed.evidence}; no checkpoint to cut')
  unreadable = checkpoints.unreadable(prefix) is not None
  return Landing(did, killed.landed and unreadable,
                 f'{killed.evidence}; {os.path.basename(prefix)} '
                 f'{"no longer reads" if unreadable else "still reads"}')


def _refused(answer) -> Optional[str]:
  """A Slurm command's refusal (None: it exited 0)."""
  if answer.returncode == 0:
    return None
  return answer.stderr.strip() or f'exit {answer.returncode}'


def _slurm_restarts(slurm, job: str) -> int:
  answer = slurm.run(['scontrol', 'show', 'job', '--oneliner', job])
  return int(slurm_field(answer.stdout, 'Restarts') or 0)


def _requeue(slurm, job: str) -> Landing:
  before = _slurm_restarts(slurm, job)
  refused = _refused(slurm.run(['scontrol', 'requeue', job]))
  if refused:
    return Landing('scontrol requeue', False, refused)
  after = evidence.wait_for(lambda: _slurm_restarts(slurm, job),
                            lambda restarts: restarts > before, SHOW_SECONDS)
  return Landing('scontrol requeue', after > before,
                 f'Slurm counts {after} restarts of the job, {before} before')


def _cancel_step(slurm, job: str) -> Landing:
  steps = slurm.run(['squeue', '-h', '-s', '-j', job, '-o', '%i']
                    ).stdout.split()
  numbered = [s for s in steps if re.fullmatch(r'\d+\.\d+', s)]
  if not numbered:
    return Landing('no step running', False, 'no step running')
  refused = _refused(slurm.run(['scancel', numbered[-1]]))
  if refused:
    return Landing(f'scancel {numbered[-1]}', False, refused)
  # slurmstepd's own line, in the step's output (the batch script's).
  return Landing(f'scancel {numbered[-1]}', None, '',
                 rf'\*\*\* STEP {re.escape(numbered[-1])} ON \S+ CANCELLED')


def _node_down(slurm, host) -> Landing:
  refused = _refused(slurm.run(['scontrol', 'update', f'nodename={host.name}',
                                'state=down', 'reason=soak']))
  if refused:
    return Landing(host.name, False, refused)
  # slurmctld may show the update a moment later on a busy machine (once
  # the suite read IDLE at once): the state is read until it says DOWN,
  # for a few seconds. The testbed's Slurm returns a DOWN node to service
  # as its slurmd registers again (ReturnToService=2), so on a loaded
  # machine the reads can miss the DOWN between (once IDLE all 5 s while
  # srun said "Node failure"): then the job's own lines decide, srun's or
  # the launcher's naming the node lost.
  deadline = time.monotonic() + SHOW_SECONDS
  while True:
    state = slurm_field(slurm.run(['scontrol', 'show', 'node', host.name]
                                  ).stdout, 'State') or ''
    if 'DOWN' in state or time.monotonic() > deadline:
      break
    time.sleep(0.5)
  seen = f'Slurm has {host.name} in state {state or "unknown"}'
  if 'DOWN' in state:
    return Landing(host.name, True, seen)
  name = re.escape(host.name)
  return Landing(host.name, None, seen,
                 rf'Node failure on {name}|Slurm lost node {name}')


def inject(cluster, slurm, processes: Processes, plan: JobPlan, fault: str,
           job, model_dir: str, record: JobRecord, timers: List) -> Landing:
  """Does `fault` to `job` (the launcher's process, or a Slurm job id) on
  `cluster` (and its `slurm`); appends to `timers` the (when, action)
  pairs that undo a passing fault."""
  host = cluster.hosts[plan.victim]
  if fault == 'kill_rank':
    return _signal_rank(processes, plan, signal.SIGKILL, GONE)
  if fault == 'freeze_rank':
    return _signal_rank(processes, plan, signal.SIGSTOP, STOPPED)
  if fault == 'pause_rank':
    landing = _signal_rank(processes, plan, signal.SIGSTOP, STOPPED)
    timers.append((time.monotonic() + 3, processes.resume_stopped))
    return landing
  if fault == 'cut_link':
    return _cut(cluster, host, timers, heal_after=None)
  if fault == 'flap_link':
    return _cut(cluster, host, timers, heal_after=20)
  if fault == 'kill_launcher':
    return _kill_launcher(job)
  if fault == 'term_launcher':
    refused = _signal_launcher(job, signal.SIGTERM)
    return Landing(f'pid {job.pid}', False if refused else None,
                   refused or '', STOPPED_BY_SIGTERM)
  if fault == 'disk_full':
    return _fill(model_dir, timers)
  if fault == 'truncate_newest':
    return _kill_and_truncate(processes, plan, model_dir, record)
  if fault == 'slurm_usr1':
    refused = _refused(slurm.run(['scancel', '--signal=USR1', job]))
    return Landing('scancel --signal=USR1', False if refused else None,
                   refused or '', WARNED)
  if fault == 'slurm_requeue':
    return _requeue(slurm, job)
  if fault == 'slurm_cancel_step':
    return _cancel_step(slurm, job)
  if fault == 'slurm_node_down':
    return _node_down(slurm, host)
  raise ValueError(fault)


def confirm(fault: FaultRecord, lines_after: Sequence[str]) -> None:
  """Decides a fault only the job's lines show: landed where a line logged
  after it matches what it awaits."""
  if fault.landed is not None:
    return
  shown = next((line for line in lines_after
                if re.search(fault.awaits, line)), None)
  fault.landed = shown is not None
  fault.evidence = (shown.strip() if shown else
                    f'no line after it matches {fault.awaits!r}')
