"""The fault soak's invariants (runner.py): what a job did, as the
soak saw it (JobRecord), and the pure checks it must pass: it ended where
planned, every fault landed and was recovered from within its bound, it
left no process, every restart resumed where it should, it lost no data,
ended with the uninterrupted run's weights and recorded its attempts.
Each check fails on what it cannot read rather than passing it. Tested in
tests/unit/test_soak_invariants.py.
"""

import dataclasses
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from testbed.soak.plan import JobPlan, recovery_bound

# How far a shrunk job may end from the uninterrupted run's weights, as a
# share of the distance that run's weights moved after its first
# checkpoint: the global batch is kept, but batch norm sees larger
# per-worker batches after a shrink, so the paths part a little.
SHRUNK_DRIFT = 0.25


@dataclasses.dataclass
class FaultRecord:
  """One fault as the soak dealt it, and what showed that it landed."""
  name: str
  moment: str
  at: float  # Seconds from the job's start.
  did: str = ''  # What the soak did, as the fault's own code says.
  # Set from evidence outside that code (the process gone or stopped, the
  # link down, Slurm's own state, the job's line); None: the job's lines
  # decide once it ended, by `awaits`.
  landed: Optional[bool] = None
  evidence: str = ''  # What showed it landed, or why it did not.
  awaits: str = ''  # The pattern of the line that shows it landed.
  # Seconds from it to the job's next productive step (None: no step
  # followed; the end's bound holds then).
  recovery: Optional[float] = None


class Restart(NamedTuple):
  """The attempt after a restart (or a requeue), as the log shows it."""
  saved: Tuple[int, ...]  # The steps of the checkpoints saved before it.
  resumed: Optional[int]  # The step it restored (None: it did not).
  trained: bool  # Whether it logged a step or an evaluation.


@dataclasses.dataclass
class JobRecord:
  """What a job did, as the soak saw it (all the invariants read)."""
  plan: JobPlan
  outcome: str  # completed, named, killed, unnamed, HANG, missed, wrong end
  seconds: float = 0.0  # From the last fault to the end.
  bound: float = 0.0
  last_line: str = ''
  left_processes: Dict[str, List[str]] = dataclasses.field(
      default_factory=dict)
  # (last step logged before a restart, step it resumed at), per restart.
  resumes: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
  restarts: List[Restart] = dataclasses.field(default_factory=list)
  # Steps of the readable checkpoints when the (first) fault struck.
  readable_before: List[int] = dataclasses.field(default_factory=list)
  readable_after: List[int] = dataclasses.field(default_factory=list)
  # Checkpoint file name -> sha256, when the fault struck and at the end.
  files_before: Dict[str, str] = dataclasses.field(default_factory=dict)
  files_after: Dict[str, str] = dataclasses.field(default_factory=dict)
  truncated: List[str] = dataclasses.field(default_factory=list)
  interval: int = 4
  # run_summary.json's train_steps: the step the run ended at (None: it
  # wrote no summary).
  summary_steps: Optional[int] = None
  weights: Optional[str] = None
  # False only where the soak was told not to run the uninterrupted runs
  # (--no_reference): a reference that failed must not turn the check off.
  weights_compared: bool = True
  reference_weights: Optional[str] = None
  reference_error: str = ''  # Why the uninterrupted run gave no weights.
  shrank: bool = False
  # A shrunk job's final weights against the uninterrupted run's: the
  # distance between them over the distance the uninterrupted run moved.
  drift: Optional[float] = None
  restarts_logged: int = 0
  summary_restarts: Optional[int] = None
  # The step each shrink or regrowth the log shows resumed at.
  world_changes: List[int] = dataclasses.field(default_factory=list)
  summary_world_sizes: Optional[int] = None
  requeues_logged: int = 0
  summary_requeues: Optional[int] = None
  seconds_to_named: Optional[float] = None
  restart_to_step: Optional[float] = None
  goodput: Optional[float] = None
  log_tail: str = ''
  # The faults dealt, in the plan's order (fewer where the job ended or
  # stalled before a moment).
  faults: List[FaultRecord] = dataclasses.field(default_factory=list)


ENDED_WELL = ('completed', 'named', 'killed')


def wrong_end(summary_steps: Optional[int], planned: int) -> str:
  """Why a run that exited 0 did not end where planned ('': it did)."""
  if summary_steps is None:
    return 'exited 0 without a run_summary.json'
  if summary_steps != planned:
    return f'exited 0 at step {summary_steps}, not its planned {planned}'
  return ''


def check_ended(record: JobRecord) -> List[str]:
  """It ended well: at its planned step, on a line naming the fault, or
  killed with its launcher. Whatever else it did breaks this, so that an
  outcome added later cannot pass unseen."""
  if record.outcome in ('completed', 'wrong end'):
    why = wrong_end(record.summary_steps, record.plan.steps)
    if why:
      return [why]
  if record.outcome == 'HANG':
    return [f'no end within {record.bound:.0f} s of the last fault']
  if record.outcome == 'soak error':
    return [f'the soak failed: {record.last_line}']
  if record.outcome == 'unnamed':
    return [f'ended without a line naming the fault: {record.last_line!r}']
  if record.outcome == 'missed':
    faults = record.plan.faults
    name, moment = faults[min(len(record.faults), len(faults) - 1)]
    return [f'ended before its {name} at {moment} struck']
  if record.outcome not in ENDED_WELL:
    return [f'outcome {record.outcome!r}']
  return []


def check_faults_landed(record: JobRecord) -> List[str]:
  """Every planned fault landed: one that did not (no rank to hit, the
  process gone first, a command refused) tested nothing, and the job's
  ending well says nothing of it."""
  planned = len(record.plan.faults)
  landed = sum(fault.landed is True for fault in record.faults)
  if landed == planned:
    return []
  return [f'{landed} of {planned} faults landed'] + [
      f'{fault.name} at {fault.moment}: ' + (
          fault.evidence or f'not shown ({fault.did})')
      for fault in record.faults if fault.landed is not True]


def check_recoveries(record: JobRecord) -> List[str]:
  """Each landed fault recovered (the job's next step) within its bound:
  the time to notice it and one restart, plus as much for each fault that
  struck again before it recovered."""
  broken = []
  for number, fault in enumerate(record.faults):
    if not fault.landed or fault.recovery is None:
      continue
    bound = sum(recovery_bound(later.name) for later in record.faults[number:]
                if later.landed and later.at <= fault.at + fault.recovery)
    if fault.recovery > bound:
      broken.append(f'{fault.name} at {fault.moment}: {fault.recovery:.0f} s '
                    f'to the next step, more than {bound:.0f} s')
  return broken


def check_no_processes(record: JobRecord) -> List[str]:
  return [f'left on {host}: {", ".join(procs)}'
          for host, procs in sorted(record.left_processes.items())]


def _step_of(name: str) -> Optional[int]:
  found = re.match(r'ckpt-(\d+)\.', name)
  return int(found.group(1)) if found else None


def check_restarts_resume(record: JobRecord) -> List[str]:
  """As many restarts resumed from a checkpoint as trained again after one
  was saved (the soak's truncation aside): a restart that starts over at
  step 0 redoes everything, yet passes the redo bound, which reads resumes
  only."""
  cut = {_step_of(name) for name in record.truncated}
  due = [number for number, restart in enumerate(record.restarts, 1)
         if restart.trained and set(restart.saved) - cut]
  over = [number for number in due
          if record.restarts[number - 1].resumed is None]
  if not over:
    return []
  return [f'{len(due)} restart(s) trained again after a checkpoint was '
          f'saved, {len(due) - len(over)} resumed from one (restart '
          f'{", ".join(map(str, over))} started over)']


def check_resumes(record: JobRecord) -> List[str]:
  """Each restart resumes at a checkpoint no older than the newest that
  read when the fault struck, and redoes at most two intervals (three where
  the fault truncated the newest): checkpoints are written beside training
  (checkpoints.Saver), so a fault during a write finds the one before it
  the newest, and the next save waits for the write, so no more than one
  interval is trained while it runs."""
  broken = []
  allowed = record.interval * (3 if record.plan.truncates else 2)
  newest = max(record.readable_before, default=0)
  for reached, resumed in record.resumes:
    if reached - resumed > allowed:
      broken.append(f'redid {reached - resumed} steps ({resumed} after '
                    f'{reached}), more than {allowed}')
    if resumed < newest - (record.interval if record.truncated else 0):
      broken.append(f'resumed at step {resumed}, older than the newest '
                    f'readable checkpoint ckpt-{newest}')
  return broken


def check_data(record: JobRecord) -> List[str]:
  """No readable checkpoint lost; no checkpoint file that existed at the
  fault gone or changed (the soak's own truncation aside; a resume may
  write a checkpoint after its step again)."""
  broken = []
  lost = sorted(set(record.readable_before) - set(record.readable_after))
  if lost:
    broken.append('readable checkpoints lost: ' +
                  ', '.join(f'ckpt-{s}' for s in lost))
  resumed = min((r for _, r in record.resumes), default=None)
  for name, digest in sorted(record.files_before.items()):
    if name in record.truncated:
      continue
    if name not in record.files_after:
      broken.append(f'{name} lost')
    elif record.files_after[name] != digest and (
        resumed is None or _step_of(name) <= resumed):
      broken.append(f'{name} changed')
  return broken


def check_weights(record: JobRecord) -> List[str]:
  """A completed job ends with the uninterrupted run's weights (a shrunk
  one near them). Whatever leaves nothing to compare breaks it: a failed
  uninterrupted run (whatever this job's outcome: the soak cannot judge
  its layout), or a digest or drift not read."""
  if not record.weights_compared:
    return []
  if record.reference_error:
    return [f'the uninterrupted run of the layout failed '
            f'({record.reference_error}): nothing to compare with']
  if record.outcome != 'completed':
    return []
  if record.shrank:
    if record.drift is None:
      return ['a shrunk job\'s drift from the uninterrupted run was not '
              'measured']
    if record.drift > SHRUNK_DRIFT:
      return [f'a shrunk job ended {record.drift:.3f} of the uninterrupted '
              f'run\'s own travel away from its weights (at most '
              f'{SHRUNK_DRIFT})']
    return []
  if record.reference_weights is None:
    return ['the uninterrupted run recorded no weights_sha256']
  if record.weights is None:
    return ['run_summary.json records no weights_sha256']
  if record.weights != record.reference_weights:
    return ['weights differ from the uninterrupted run '
            f'({record.weights[:12]} vs {record.reference_weights[:12]})']
  return []


def expected_world_sizes(change_steps: Sequence[int]) -> int:
  """How many shapes world_sizes.json keeps after changes at these steps:
  a change drops the shapes at or after its step (resnet_keras/engine/world.py),
  as a shrink before the first checkpoint replaces the first shape."""
  kept = [0]
  for step in change_steps:
    kept = [s for s in kept if s < step] + [step]
  return len(kept)


def check_attempts(record: JobRecord) -> List[str]:
  """run_summary.json counts the restarts, world sizes and requeues the
  log shows (where the job completed and wrote one)."""
  if record.outcome != 'completed':
    return []
  broken = []
  for what, logged, recorded in (
      ('restarts', record.restarts_logged, record.summary_restarts),
      ('world sizes', expected_world_sizes(record.world_changes),
       record.summary_world_sizes),
      ('requeues', record.requeues_logged, record.summary_requeues)):
    if recorded is not None and recorded != logged:
      broken.append(f'run_summary.json has {recorded} {what}, the log '
                    f'{logged}')
  return broken


INVARIANTS = (('ends', check_ended), ('faults landed', check_faults_landed),
              ('recovery', check_recoveries),
              ('no processes', check_no_processes),
              ('resume', check_resumes),
              ('restarts resume', check_restarts_resume), ('data', check_data),
              ('weights', check_weights), ('attempts', check_attempts))


def broken_invariants(record: JobRecord) -> List[str]:
  return [f'{name}: {problem}' for name, check in INVARIANTS
          for problem in check(record)]
