"""The fault soak's plan (runner.py): the fault catalogue, the
placements and backends, and the jobs a seed draws, each with its fault,
moment and delay; the bound on a job's end. Pure: tested in
tests/unit/test_soak_plan.py.
"""

import dataclasses
import random
from typing import List, Sequence, Tuple

PLACEMENTS = ('this_host', 'ssh', 'slurm')
BACKENDS = ('horovod', 'multi_worker_mirrored')
MOMENTS = ('startup', 'mid_step', 'checkpoint', 'evaluation', 'export',
           'recovery')
_ALL = PLACEMENTS
_REMOTE = ('ssh', 'slurm')  # Where a host other than the launcher's works.
_SLURM = ('slurm',)
_ANY_MOMENT = MOMENTS
_SAVES = ('checkpoint', 'export')


@dataclasses.dataclass(frozen=True)
class Fault:
  name: str
  what: str
  moments: Tuple[str, ...]
  placements: Tuple[str, ...]
  # Whether the newest checkpoint is truncated with it: the resume may
  # then redo two checkpoint intervals.
  truncates: bool = False


# The fault catalogue: fault x the moments it is drawn at x the placements
# it applies to. A moment of 'recovery' means: a rank killed mid-step
# first, then this fault while the job restarts.
CATALOGUE = (
    Fault('kill_rank', 'a rank killed (kill -9)', _ANY_MOMENT, _ALL),
    Fault('freeze_rank', 'a rank frozen (SIGSTOP) past --failure_timeout',
          _ANY_MOMENT, _ALL),
    Fault('pause_rank', 'a rank frozen (SIGSTOP) for 3 s, then SIGCONT',
          _ANY_MOMENT, _ALL),
    Fault('cut_link', "a worker host's link cut for good", _ANY_MOMENT,
          _REMOTE),
    Fault('flap_link', "a worker host's link cut for 20 s, then healed",
          _ANY_MOMENT, _REMOTE),
    Fault('kill_launcher', 'the launcher killed (kill -9)', _ANY_MOMENT,
          ('this_host', 'ssh')),
    Fault('term_launcher', 'the launcher SIGTERM\'d', _ANY_MOMENT,
          ('this_host', 'ssh')),
    Fault('disk_full', "--model_dir's file system full during a save "
          '(freed 10 s later)', _SAVES, _ALL),
    Fault('truncate_newest', 'a rank killed and the newest checkpoint\'s '
          'files truncated before the restart', ('mid_step', 'checkpoint',
                                                 'evaluation', 'recovery'),
          _ALL, truncates=True),
    Fault('slurm_usr1', 'scancel --signal=USR1 (preemption warning)',
          _ANY_MOMENT, _SLURM),
    Fault('slurm_requeue', 'scontrol requeue', _ANY_MOMENT, _SLURM),
    Fault('slurm_cancel_step', 'scancel of the running step', _ANY_MOMENT,
          _SLURM),
    Fault('slurm_node_down', 'a worker node set DOWN', _ANY_MOMENT, _SLURM),
)
FAULTS = {fault.name: fault for fault in CATALOGUE}
# What comes first when the drawn moment is 'recovery'.
FIRST_FAULT = ('kill_rank', 'mid_step')
# Seconds the fault waits after its moment is seen, at most (drawn).
MAX_DELAY = {'startup': 4.0, 'mid_step': 1.0, 'checkpoint': 0.3,
             'evaluation': 2.0, 'export': 2.0, 'recovery': 6.0}
# The bound on a job's end: this many seconds after the last fault, plus
# one uninterrupted job's duration per restart or requeue it may make.
BOUND_AFTER_FAULT = 120
STEP_CHOICES = (24, 32)
WORKERS = 3
FAILURE_TIMEOUT = 12  # The jobs' --failure_timeout, seconds.
SLURM_KILL_WAIT = 30  # Slurm's default KillWait (testbed/slurm.py keeps it).
# What a recovery may take, from the fault to the job's next step: the time
# to notice the fault, then one restart's start-up (18-27 s measured an
# attempt, benchmarks/README.md; three times that on a machine the suite's
# other workers share).
RESTART_SECONDS = 90
# A peer that hangs the collectives (frozen, cut off, its node down) is
# named at the stuck-worker deadline, 10 x --failure_timeout, and a
# failure_timeout later by the launcher.
_HUNG = 11 * FAILURE_TIMEOUT
# Seconds to notice each fault, at most: a process's end within
# --failure_timeout; a passing fault's own span first; Slurm's requeue
# once KillWait has ended the last start and the soak released the job.
DETECT_SECONDS = {
    'kill_rank': FAILURE_TIMEOUT, 'freeze_rank': _HUNG,
    'pause_rank': 3 + FAILURE_TIMEOUT, 'cut_link': _HUNG, 'flap_link': _HUNG,
    'kill_launcher': FAILURE_TIMEOUT, 'term_launcher': FAILURE_TIMEOUT,
    'disk_full': 10 + FAILURE_TIMEOUT, 'truncate_newest': FAILURE_TIMEOUT,
    'slurm_usr1': 2 * SLURM_KILL_WAIT, 'slurm_requeue': 2 * SLURM_KILL_WAIT,
    'slurm_cancel_step': FAILURE_TIMEOUT, 'slurm_node_down': _HUNG,
}


@dataclasses.dataclass(frozen=True)
class JobPlan:
  index: int
  placement: str
  backend: str
  faults: Tuple[Tuple[str, str], ...]  # (fault, moment), in order.
  delay: float  # Seconds after the (last) moment is seen.
  victim: int  # Which worker (1..WORKERS-1; 0 is the chief) or host.
  steps: int

  @property
  def fault(self) -> str:
    return self.faults[-1][0]

  @property
  def moment(self) -> str:
    return self.faults[-1][1]

  @property
  def truncates(self) -> bool:
    return any(FAULTS[name].truncates for name, _ in self.faults)


def applicable(placement: str) -> List[Fault]:
  """The catalogue's faults that apply to `placement`."""
  return [fault for fault in CATALOGUE if placement in fault.placements]


def draw_plan(seed: int, jobs: int, placements: Sequence[str],
              backends: Sequence[str],
              steps: Sequence[int] = STEP_CHOICES) -> List[JobPlan]:
  """The soak's jobs for `seed`: every placement x backend pair in a
  shuffled cycle (so a few jobs cover them all), each with a fault and a
  moment drawn from the catalogue."""
  rng = random.Random(seed)
  pairs = [(p, b) for p in placements for b in backends]
  rng.shuffle(pairs)
  plans = []
  for index in range(jobs):
    placement, backend = pairs[index % len(pairs)]
    fault = rng.choice(applicable(placement))
    moment = rng.choice(fault.moments)
    faults = ((fault.name, moment),)
    if moment == 'recovery':
      faults = (FIRST_FAULT,) + faults
    plans.append(JobPlan(index, placement, backend, faults,
                         round(rng.uniform(0, MAX_DELAY[moment]), 2),
                         rng.randrange(1, WORKERS), rng.choice(steps)))
  return plans


def max_restarts(plan: JobPlan) -> int:
  return len(plan.faults) + 1


def bound_seconds(plan: JobPlan, job_seconds: float) -> float:
  """How long after its last fault a job may take to end: 120 s plus one
  uninterrupted job's duration per restart or requeue it may make."""
  requeues = sum(name in ('slurm_usr1', 'slurm_requeue')
                 for name, _ in plan.faults)
  return BOUND_AFTER_FAULT + (max_restarts(plan) + requeues) * job_seconds


def recovery_bound(fault: str) -> float:
  """Seconds from `fault` to the job's next step, at most."""
  return DETECT_SECONDS[fault] + RESTART_SECONDS
