"""A randomized fault soak: real tiny jobs on the namespace cluster
(cluster.py) and its Slurm (slurm.py), each hit by one or two faults drawn
from a seed at a moment drawn from it, then checked against invariants.

  python -m testbed.soak --seed 1 --jobs 20 [--placements this_host,ssh,slurm]
      [--backends horovod,multi_worker_mirrored] [--out rows.jsonl]

Root only (network namespaces, tmpfs mounts). One row per job, a summary
table at the end; the exit code is 1 if any invariant broke. The plan (which
placement, backend, fault, moment and delay each job gets) and the
invariants are pure functions below, tested in tests/unit/test_soak.py; the
rest runs the jobs. docs/testing.md has the catalogue and the bound.
"""

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from typing import Dict, List, Optional, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO_ROOT, 'demo_resnet_keras.py')
TRAINER = 'resnet_ctl_imagenet_main.py'

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
# Seconds the job's processes get to be gone once it ended and every link
# is back (Slurm's slurmd, reconnected, ends what it ran for an ended job).
LEFT_GRACE = 30
# How far a shrunk job may end from the uninterrupted run's weights, as a
# share of the distance that run's weights moved after its first
# checkpoint: the global batch is kept, but batch norm sees larger
# per-worker batches after a shrink, so the paths part a little.
SHRUNK_DRIFT = 0.25
WORKERS = 3


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


# --- invariants: pure checks of what a job left --------------------------


@dataclasses.dataclass
class JobRecord:
  """What a job did, as the soak saw it (all the invariants read)."""
  plan: JobPlan
  outcome: str  # completed, named, killed, unnamed, HANG, missed
  seconds: float = 0.0  # From the last fault to the end.
  bound: float = 0.0
  last_line: str = ''
  left_processes: Dict[str, List[str]] = dataclasses.field(
      default_factory=dict)
  # (last step logged before a restart, step it resumed at), per restart.
  resumes: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
  # Steps of the readable checkpoints when the (first) fault struck.
  readable_before: List[int] = dataclasses.field(default_factory=list)
  readable_after: List[int] = dataclasses.field(default_factory=list)
  # Checkpoint file name -> sha256, when the fault struck and at the end.
  files_before: Dict[str, str] = dataclasses.field(default_factory=dict)
  files_after: Dict[str, str] = dataclasses.field(default_factory=dict)
  truncated: List[str] = dataclasses.field(default_factory=list)
  interval: int = 4
  weights: Optional[str] = None
  reference_weights: Optional[str] = None
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


ENDED_WELL = ('completed', 'named', 'killed')


def check_ended(record: JobRecord) -> List[str]:
  if record.outcome == 'HANG':
    return [f'no end within {record.bound:.0f} s of the last fault']
  if record.outcome == 'soak error':
    return [f'the soak failed: {record.last_line}']
  if record.outcome == 'unnamed':
    return [f'ended without a line naming the fault: {record.last_line!r}']
  return []


def check_no_processes(record: JobRecord) -> List[str]:
  return [f'left on {host}: {", ".join(procs)}'
          for host, procs in sorted(record.left_processes.items())]


def check_resumes(record: JobRecord) -> List[str]:
  """Each restart resumes at a checkpoint no older than the newest that
  read when the fault struck, and redoes at most one interval (two where
  the fault truncated the newest)."""
  broken = []
  allowed = record.interval * (2 if record.plan.truncates else 1)
  newest = max(record.readable_before, default=0)
  for reached, resumed in record.resumes:
    if reached - resumed > allowed:
      broken.append(f'redid {reached - resumed} steps ({resumed} after '
                    f'{reached}), more than {allowed}')
    if resumed < newest - (record.interval if record.truncated else 0):
      broken.append(f'resumed at step {resumed}, older than the newest '
                    f'readable checkpoint ckpt-{newest}')
  return broken


def _step_of(name: str) -> Optional[int]:
  found = re.match(r'ckpt-(\d+)\.', name)
  return int(found.group(1)) if found else None


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
  if record.outcome != 'completed':
    return []
  if record.shrank:
    if record.drift is not None and record.drift > SHRUNK_DRIFT:
      return [f'a shrunk job ended {record.drift:.3f} of the uninterrupted '
              f'run\'s own travel away from its weights (at most '
              f'{SHRUNK_DRIFT})']
    return []
  if record.reference_weights is None or record.weights is None:
    return []
  if record.weights != record.reference_weights:
    return ['weights differ from the uninterrupted run '
            f'({record.weights[:12]} vs {record.reference_weights[:12]})']
  return []


def expected_world_sizes(change_steps: Sequence[int]) -> int:
  """How many shapes world_sizes.json keeps after changes at these steps:
  a change drops the shapes at or after its step (resnet_keras/world.py),
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


INVARIANTS = (('ends', check_ended), ('no processes', check_no_processes),
              ('resume', check_resumes), ('data', check_data),
              ('weights', check_weights), ('attempts', check_attempts))


def broken_invariants(record: JobRecord) -> List[str]:
  return [f'{name}: {problem}' for name, check in INVARIANTS
          for problem in check(record)]


# --- reading a job's log ---------------------------------------------------

_STEP = re.compile(r' I step (\d+)/')
_RESUMED = re.compile(r'restored from \S+ at step (\d+)')
# The launcher's lines that name a fault.
NAMING = (r'job failed|job stopped by|Slurm lost node|requeued|no space left|'
          r'the chief finished the run')
_NAMED = re.compile(NAMING + r'|^error:|the job ends')


def resumes_in(lines: Sequence[str]) -> List[Tuple[int, int]]:
  """(last step logged before, step restored at) for each resume."""
  found, reached = [], 0
  for line in lines:
    step = _STEP.search(line)
    if step:
      reached = max(reached, int(step.group(1)))
    resumed = _RESUMED.search(line)
    if resumed and reached:
      found.append((reached, int(resumed.group(1))))
      reached = 0
  return found


_CHANGE = re.compile(r'the job (?:shrinks|grows) .*(?:resuming at step|from '
                     r'step) (\d+)')


def world_changes(lines: Sequence[str]) -> List[int]:
  """The step each shrink or regrowth in the log resumes at."""
  return [int(m.group(1)) for line in lines for m in [_CHANGE.search(line)]
          if m]


def last_line(lines: Sequence[str]) -> str:
  meaningful = [line for line in lines
                if line.strip() and 'port guard' not in line]
  return meaningful[-1] if meaningful else ''


def is_named(line: str) -> bool:
  return bool(_NAMED.search(line))


# --- running jobs ----------------------------------------------------------


class Log:
  """A job's log file, with when the soak first saw each line."""

  def __init__(self, path: str):
    self.path = path
    self.lines: List[str] = []
    self.seen: List[float] = []
    self._offset = 0

  def poll(self) -> None:
    try:
      with open(self.path, errors='replace') as f:
        f.seek(self._offset)
        text = f.read()
    except FileNotFoundError:
      return
    end = text.rfind('\n') + 1
    self._offset += len(text[:end].encode(errors='replace'))
    now = time.monotonic()
    for line in text[:end].splitlines():
      self.lines.append(line)
      self.seen.append(now)

  def first(self, pattern: str, after: float = 0.0) -> Optional[float]:
    for line, when in zip(self.lines, self.seen):
      if when >= after and re.search(pattern, line):
        return when
    return None


def _moment_pattern(moment: str, steps: int, rng: random.Random) -> str:
  if moment == 'startup':
    return r'TF_CONFIG from|plan: global batch'
  if moment == 'mid_step':
    return rf' I step {rng.randrange(3, steps // 2 - 1) * 2}/'
  if moment == 'checkpoint':
    return rf' I step {rng.randrange(1, steps // 4) * 4}/'
  if moment == 'evaluation':
    return rf'saved checkpoint \S*ckpt-{steps}$'
  if moment == 'export':
    return r'eval at step'
  return r'restart \d+ of|requeued \d+ time'


class Soak:
  """The cluster (and Slurm) and the jobs run on it."""

  def __init__(self, cluster, slurm=None, work_dir: Optional[str] = None,
               compare_weights: bool = True, out=None):
    self.cluster = cluster
    self.slurm = slurm
    self.work_dir = work_dir or tempfile.mkdtemp(prefix='resnet_keras_soak_')
    self.compare_weights = compare_weights
    self.out = out
    # (placement, backend, steps) -> (weights digest, seconds, model_dir).
    self._references: Dict[Tuple[str, str, int],
                           Tuple[Optional[str], float, str]] = {}
    # TensorFlow, which reads checkpoints, imported before the first job's
    # moment rather than at it.
    from resnet_keras import checkpoints  # pylint: disable=g-import-not-at-top,unused-import
    self._stopped: List[int] = []
    self._mounts: List[str] = []

  # --- a job's command ---------------------------------------------------

  def args(self, plan: JobPlan, model_dir: str, reference: bool = False
           ) -> List[str]:
    backend = (['--use_horovod', '--batch_size=4']
               if plan.backend == 'horovod' else
               ['-ds', 'multi_worker_mirrored', '--batch_size=12'])
    per_host = WORKERS if plan.placement == 'this_host' else 1
    args = backend + [
        f'--num_workers_per_hls={per_host}', f'--train_steps={plan.steps}',
        '--train_epochs=1', '--global_seed=7',
        '--checkpoint_interval_steps=4', '--max_checkpoints=100',
        '--enable_checkpoint_and_export', '--failure_timeout=12',
        f'--model_dir={model_dir}', '--use_synthetic_data',
        '--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--num_classes=10', '--steps_per_loop=2', '--log_steps=2',
        '--num_eval_examples=13', '--noplots']
    if not reference:
      args.append(f'--max_restarts={max_restarts(plan)}')
      if plan.placement != 'this_host':
        args.append('--min_hosts=2')
    return args

  def _env(self, plan: JobPlan) -> Dict[str, str]:
    env = self.cluster.launcher_env(dict(os.environ))
    env['HOROVOD_FUSION_THRESHOLD'] = '0'  # Reductions in a fixed order.
    if plan.placement == 'this_host':
      env['MULTI_HLS_IPS'] = ''
    return env

  def start(self, plan: JobPlan, args: List[str], log_path: str):
    """The launcher (a process here) or the Slurm job id."""
    if plan.placement == 'slurm':
      script = os.path.join(os.path.dirname(log_path), 'job.sh')
      env_line = 'export HOROVOD_FUSION_THRESHOLD=0'
      with open(script, 'w') as f:
        f.write(f'#!/bin/bash\n{env_line}\ncd {REPO_ROOT} && exec '
                f'{sys.executable} {DEMO} {shlex.join(args)}\n')
      answer = self.slurm.run(
          ['sbatch', '--parsable', f'--nodes={WORKERS}',
           '--ntasks-per-node=1', '--no-kill', '--requeue',
           '--open-mode=append', f'--output={log_path}', script])
      if answer.returncode:
        raise RuntimeError(f'sbatch: {answer.stderr.strip()}')
      return answer.stdout.strip().split(';')[0]
    with open(log_path, 'w') as log:
      return self.cluster.popen(
          self.cluster.hosts[0], [sys.executable, DEMO] + args,
          env=self._env(plan), cwd=REPO_ROOT, stdout=log,
          stderr=subprocess.STDOUT)

  # --- a job's state -----------------------------------------------------

  def _slurm_state(self, job_id: str) -> str:
    answer = self.slurm.run(['scontrol', 'show', 'job', '--oneliner', job_id])
    found = re.search(r'JobState=(\S+)', answer.stdout)
    return found.group(1) if found else 'GONE'

  def ended(self, plan: JobPlan, job) -> Optional[int]:
    """The job's exit code once it ended (Slurm: 0 for COMPLETED)."""
    if plan.placement != 'slurm':
      return job.poll()
    state = self._slurm_state(job)
    if state == 'PENDING' and 'BeginTime' in self.slurm.run(
        ['scontrol', 'show', 'job', job]).stdout:
      # A requeued job is held 120 s; the test cluster starts it once the
      # last start's steps are gone (as tests/multihost/test_slurm.py):
      # this job's, as a step another job left on a lost node may never go.
      if not self._job_pids((f'slurmstepd: [{job}.',)):
        self.slurm.run(['scontrol', 'update', f'JobId={job}',
                        'StartTime=now'])
      return None
    if state in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
                 'OUT_OF_MEMORY', 'GONE', 'BOOT_FAIL', 'DEADLINE'):
      time.sleep(3)  # A requeue passes through an ended state: confirm.
      again = self._slurm_state(job)
      if again == state:
        return 0 if state == 'COMPLETED' else 1
    return None

  def stop_job(self, plan: JobPlan, job) -> None:
    if plan.placement == 'slurm':
      self.slurm.run(['scancel', job])
    elif job.poll() is None:
      job.kill()
      job.wait(timeout=30)

  # Every process a job runs, on any host: the launcher, workers, MPI's
  # and Slurm's launchers, data servers.
  JOB_PATTERNS = (TRAINER, 'demo_resnet_keras', 'orted', 'mpirun', 'srun',
                  'resnet_keras.data.service', 'prterun', 'prted')

  def _job_pids(self, patterns=JOB_PATTERNS) -> Dict[str, List[int]]:
    found = {}
    for host in self.cluster.hosts:
      pids = sorted({pid for pattern in patterns
                     for pid in self.cluster.processes(host, pattern)})
      if pids:
        found[host.name] = pids
    return found

  @staticmethod
  def _cmdline(pid: int) -> str:
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        return f.read().replace(b'\0', b' ').decode(errors='replace')[:80]
    except OSError:
      return str(pid)

  def _ranks(self, plan: JobPlan) -> List[int]:
    """The trainer's PIDs, rank order where the host order gives it (the
    python processes: not mpirun's, ssh's or srun's command lines)."""
    hosts = (self.cluster.hosts[:1] if plan.placement == 'this_host' else
             self.cluster.hosts)
    pids = []
    for host in hosts:
      pids += [pid for pid in sorted(self.cluster.processes(host, TRAINER))
               if 'python' in self._cmdline(pid).split(' ')[0]]
    return pids

  # --- faults ------------------------------------------------------------

  def _victim_host(self, plan: JobPlan):
    return self.cluster.hosts[plan.victim]

  def signal_rank(self, plan: JobPlan, sig: int) -> str:
    ranks = self._ranks(plan)
    if not ranks:
      return 'no rank running'
    pid = ranks[plan.victim % len(ranks)]
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      return f'rank pid {pid} already gone'
    if sig == signal.SIGSTOP:
      self._stopped.append(pid)
    return f'pid {pid}'

  def _truncate_newest(self, model_dir: str) -> List[str]:
    from resnet_keras import run_directory  # pylint: disable=g-import-not-at-top
    latest = run_directory.latest_checkpoint(model_dir)
    if latest is None:
      return []
    names = [n for n in os.listdir(model_dir)
             if n.startswith(os.path.basename(latest.prefix) + '.')]
    for name in names:
      path = os.path.join(model_dir, name)
      os.truncate(path, os.path.getsize(path) // 2)
    return names

  def inject(self, plan: JobPlan, fault: str, job, model_dir: str,
             record: JobRecord, timers: List) -> str:
    """Does `fault`; returns what it did (for the log)."""
    host = self._victim_host(plan)
    if fault == 'kill_rank':
      return self.signal_rank(plan, signal.SIGKILL)
    if fault == 'freeze_rank':
      return self.signal_rank(plan, signal.SIGSTOP)
    if fault == 'pause_rank':
      done = self.signal_rank(plan, signal.SIGSTOP)
      timers.append((time.monotonic() + 3, self._resume_stopped))
      return done
    if fault == 'cut_link':
      self.cluster.cut_link(host)
      return host.name
    if fault == 'flap_link':
      self.cluster.cut_link(host)
      timers.append((time.monotonic() + 20,
                     lambda: self.cluster.restore_link(host)))
      return host.name
    if fault in ('kill_launcher', 'term_launcher'):
      job.send_signal(signal.SIGKILL if fault == 'kill_launcher'
                      else signal.SIGTERM)
      return f'pid {job.pid}'
    if fault == 'disk_full':
      parent = os.path.dirname(model_dir)
      filler = os.path.join(parent, 'filler')
      with open(filler, 'wb') as f:
        free = os.statvfs(parent)
        try:
          os.posix_fallocate(f.fileno(), 0, max(
              1, free.f_bavail * free.f_frsize - 32 * 1024))
        except OSError:
          pass
      timers.append((time.monotonic() + 10, lambda: os.remove(filler)))
      return f'{filler} fills {parent}'
    if fault == 'truncate_newest':
      done = self.signal_rank(plan, signal.SIGKILL)
      record.truncated = self._truncate_newest(model_dir)
      return f'{done}; truncated {", ".join(record.truncated) or "nothing"}'
    if fault == 'slurm_usr1':
      return self.slurm.run(['scancel', '--signal=USR1', job]).stderr
    if fault == 'slurm_requeue':
      return self.slurm.run(['scontrol', 'requeue', job]).stderr
    if fault == 'slurm_cancel_step':
      steps = self.slurm.run(['squeue', '-h', '-s', '-j', job,
                              '-o', '%i']).stdout.split()
      numbered = [s for s in steps if re.fullmatch(r'\d+\.\d+', s)]
      if not numbered:
        return 'no step running'
      return self.slurm.run(['scancel', numbered[-1]]).stderr or numbered[-1]
    if fault == 'slurm_node_down':
      return self.slurm.run(['scontrol', 'update', f'nodename={host.name}',
                             'state=down', 'reason=soak']).stderr or host.name
    raise ValueError(fault)

  def _resume_stopped(self) -> None:
    for pid in self._stopped:
      try:
        os.kill(pid, signal.SIGCONT)
      except ProcessLookupError:
        pass
    self._stopped = []

  # --- one job -----------------------------------------------------------

  def reference(self, plan: JobPlan) -> Tuple[Optional[str], float, str]:
    """(weights digest, seconds, model_dir) of an uninterrupted run of the
    layout."""
    key = (plan.placement, plan.backend, plan.steps)
    if key not in self._references:
      job_dir = tempfile.mkdtemp(dir=self.work_dir, prefix='reference_')
      model_dir = os.path.join(job_dir, 'model')
      clean = dataclasses.replace(plan, faults=())
      log = Log(os.path.join(job_dir, 'log.txt'))
      started = time.monotonic()
      job = self.start(clean, self.args(clean, model_dir, reference=True),
                       log.path)
      code = self.wait_for_end(clean, job, log, started + 900)
      seconds = time.monotonic() - started
      digest = None
      if code == 0:
        digest = _read_summary(model_dir).get('weights_sha256')
      else:
        self.stop_job(clean, job)
      self.heal()
      self._references[key] = (digest, seconds, model_dir)
    return self._references[key]

  def wait_for_end(self, plan, job, log, deadline, timers=()) -> Optional[int]:
    timers = list(timers)
    while time.monotonic() < deadline:
      log.poll()
      for entry in [t for t in timers if t[0] <= time.monotonic()]:
        timers.remove(entry)
        entry[1]()
      code = self.ended(plan, job)
      if code is not None:
        for _, action in timers:
          action()
        log.poll()
        return code
      time.sleep(0.2)  # Polls the job and its log.
    for _, action in timers:
      action()
    return None

  def run_job(self, plan: JobPlan) -> JobRecord:
    job_dir = tempfile.mkdtemp(dir=self.work_dir, prefix=f'job{plan.index}_')
    parent = job_dir
    if any(name == 'disk_full' for name, _ in plan.faults):
      parent = os.path.join(job_dir, 'fs')
      os.mkdir(parent)
      subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=48m', 'soak',
                      parent], check=True)
      self._mounts.append(parent)
    model_dir = os.path.join(parent, 'model')
    reference, job_seconds, reference_dir = (
        self.reference(plan) if self.compare_weights else (None, 150.0, None))
    record = JobRecord(plan, outcome='missed', reference_weights=reference)
    rng = random.Random(f'{plan.index}-{plan.delay}')
    log = Log(os.path.join(job_dir, 'log.txt'))
    started = time.monotonic()
    snapshot = os.path.join(job_dir, 'snapshot')
    job = self.start(plan, self.args(plan, model_dir), log.path)
    timers: List = []
    last_fault = started
    try:
      code = None
      for number, (fault, moment) in enumerate(plan.faults):
        pattern = _moment_pattern(moment, plan.steps, rng)
        seen = None
        while seen is None and time.monotonic() < started + 600:
          log.poll()
          seen = log.first(pattern, after=last_fault if number else 0)
          if seen is None and self.ended(plan, job) is not None:
            break
          time.sleep(0.1)  # Polls the log for the moment.
        if seen is None:  # The job ended, or stalled, before the moment.
          if self.ended(plan, job) is None:
            record.outcome = 'HANG'
            record.bound = 600
          break
        time.sleep(plan.delay if number == len(plan.faults) - 1 else 0)
        if self.ended(plan, job) is not None:
          break  # The fault came too late: 'missed'.
        if number == 0:
          record.files_before = _checkpoint_files(model_dir)
          _copy_checkpoints(model_dir, snapshot)
        last_fault = time.monotonic()
        did = self.inject(plan, fault, job, model_dir, record, timers)
        _say(f'  job {plan.index}: {fault} at {moment} '
             f'({time.monotonic() - started:.0f} s): {did}')
      else:
        record.bound = bound_seconds(plan, job_seconds)
        code = self.wait_for_end(plan, job, log, last_fault + record.bound, timers)
        record.seconds = time.monotonic() - last_fault
        record.outcome = _outcome(code, plan, log.lines)
      if record.outcome == 'HANG':
        record.log_tail = '\n'.join(log.lines[-30:])
      if record.outcome != 'missed':
        record.readable_before = _readable(snapshot)
        self._read_results(record, log, model_dir, last_fault)
        if record.shrank and record.outcome == 'completed' and reference:
          record.drift = weights_drift(model_dir, reference_dir)
    finally:
      self.stop_job(plan, job)
      self._resume_stopped()
      # A host cut off cannot hear that its job ended: what is left there
      # counts once its link is back (as a node's return on a cluster).
      self._reconnect()
      record.left_processes = self._leftovers()
      self.heal()
    return record

  def _read_results(self, record, log, model_dir, last_fault) -> None:
    lines = log.lines
    record.last_line = last_line(lines)
    record.resumes = resumes_in(lines)
    requeued = [i for i, l in enumerate(lines) if re.search(
        r'requeued \d+ time\(s\) by the scheduler', l)]
    record.requeues_logged = len(requeued)
    # A requeued job's launcher starts counting its restarts again.
    record.restarts_logged = sum(
        bool(re.search(r'restart \d+ of', l))
        for l in lines[requeued[-1] if requeued else 0:])
    record.world_changes = world_changes(lines)
    record.shrank = bool(record.world_changes)
    named = log.first(NAMING, after=last_fault)
    if named is not None:
      record.seconds_to_named = named - last_fault
    restart = log.first(r'restart \d+ of|requeued \d+ time', after=last_fault)
    if restart is not None:
      step = log.first(r' I step \d+/', after=restart)
      if step is not None:
        record.restart_to_step = step - restart
    record.files_after = _checkpoint_files(model_dir)
    record.readable_after = _readable(model_dir)
    summary = _read_summary(model_dir)
    if summary:
      record.weights = summary.get('weights_sha256')
      record.summary_restarts = summary.get('restarts')
      record.summary_world_sizes = len(summary.get('world_sizes') or []) or None
      scheduler = summary.get('scheduler') or {}
      record.summary_requeues = scheduler.get('requeues')
      goodput = summary.get('goodput')
      if isinstance(goodput, dict):
        record.goodput = goodput.get('goodput')
    if record.outcome == 'completed' and summary.get(
        'train_steps') != record.plan.steps:
      record.outcome = 'wrong end'

  def _leftovers(self) -> Dict[str, List[str]]:
    """The job's processes that outlive it by LEFT_GRACE s (then killed)."""
    deadline = time.monotonic() + LEFT_GRACE
    while self._job_pids() and time.monotonic() < deadline:
      time.sleep(0.5)  # Processes being reaped: polled.
    found = {host: [self._cmdline(pid) for pid in pids]
             for host, pids in self._job_pids().items()}
    self._kill_job_processes()
    return found

  def _kill_job_processes(self) -> None:
    for pids in self._job_pids().values():
      for pid in pids:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass

  def heal(self) -> None:
    """The cluster as before a job: links up, no firewall, nodes idle,
    the job's processes and tmpfs gone."""
    self._reconnect()
    self._kill_job_processes()
    while self._mounts:
      subprocess.run(['umount', '-l', self._mounts.pop()], check=False)
    if self.slurm is not None:
      for job in self.slurm.run(['squeue', '-h', '-o', '%i']).stdout.split():
        self.slurm.run(['scancel', job])
      for host in self.cluster.hosts:
        self.slurm.run(['scontrol', 'update', f'nodename={host.name}',
                        'state=resume'])
      try:
        self.slurm.wait_until_idle(timeout=90)
      except RuntimeError as e:
        _say(f'  Slurm not idle after the job: {e}')

  def _reconnect(self) -> None:
    for host in self.cluster.hosts:
      self.cluster.restore_link(host)
      self.cluster.clear_firewall(host)

  def close(self) -> None:
    self.heal()
    shutil.rmtree(self.work_dir, ignore_errors=True)


def _outcome(code: Optional[int], plan: JobPlan, lines: Sequence[str]) -> str:
  if code is None:
    return 'HANG'
  if code == 0:
    return 'completed'
  if any(name == 'kill_launcher' for name, _ in plan.faults):
    return 'killed'
  if plan.placement == 'slurm':
    # The batch script's output ends with the launcher's line, or with
    # Slurm's own for a job it cancelled.
    tail = [l for l in lines if 'port guard' not in l][-5:]
    return 'named' if any(is_named(l) or 'CANCELLED' in l
                          for l in tail) else 'unnamed'
  return 'named' if is_named(last_line(lines)) else 'unnamed'


def _checkpoint_files(model_dir: str) -> Dict[str, str]:
  """name -> sha256 of the files of the checkpoints the state file keeps."""
  from resnet_keras import run_directory  # pylint: disable=g-import-not-at-top
  found = {}
  for checkpoint in run_directory.kept_checkpoints(model_dir):
    prefix = os.path.basename(checkpoint.prefix)
    for name in os.listdir(model_dir):
      if name.startswith(prefix + '.'):
        with open(os.path.join(model_dir, name), 'rb') as f:
          found[name] = hashlib.sha256(f.read()).hexdigest()
  return found


def _copy_checkpoints(model_dir: str, into: str) -> None:
  """model_dir's checkpoints as they are (read later: reading takes long,
  and the job goes on writing)."""
  if os.path.isdir(model_dir):
    shutil.copytree(model_dir, into, ignore=shutil.ignore_patterns(
        'saved_model*', 'worker_*', 'filler', '*.json*', 'plots'))


def _readable(model_dir: str) -> List[int]:
  from resnet_keras import checkpoints, run_directory  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(model_dir):
    return []
  return sorted(c.step for c in run_directory.kept_checkpoints(model_dir)
                if checkpoints.unreadable(c.prefix) is None)


def _model_weights(prefix: str) -> Dict[str, np.ndarray]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name, _ in tf.train.list_variables(prefix)
          if name.startswith('model/') and 'OPTIMIZER_SLOT' not in name}


def weights_drift(model_dir: str, reference_dir: str) -> Optional[float]:
  """|w - w_ref| / |w_ref - w_ref(oldest checkpoint)| over the model's
  variables at each run's latest checkpoint (None: one does not read)."""
  from resnet_keras import run_directory  # pylint: disable=g-import-not-at-top
  kept = run_directory.kept_checkpoints(reference_dir)
  newest = run_directory.latest_checkpoint(model_dir)
  if len(kept) < 2 or newest is None:
    return None
  try:
    final, first, ours = (_model_weights(p) for p in (
        kept[0].prefix, kept[-1].prefix, newest.prefix))
  except Exception:  # pylint: disable=broad-except
    return None  # An unreadable checkpoint is check_data's to report.
  squared = lambda pairs: sum(float(((a - b) ** 2).sum()) for a, b in pairs)
  travel = squared((final[n], first[n]) for n in final)
  if not travel or set(ours) != set(final):
    return None
  return (squared((ours[n], final[n]) for n in final) / travel) ** 0.5


def _read_summary(model_dir: str) -> Dict:
  try:
    with open(os.path.join(model_dir, 'run_summary.json')) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


# --- reporting -------------------------------------------------------------

ROW = ('{job:>3} {placement:<9} {backend:<21} {fault:<17} {moment:<10} '
       '{outcome:<9} {named:>6} {first_step:>6} {redone:>6} {goodput:>7} '
       '{drift:>5}  {broken}')


def _fmt(value, spec='.1f') -> str:
  return '-' if value is None else format(value, spec)


def row(record: JobRecord) -> str:
  plan = record.plan
  redone = sum(r - s for r, s in record.resumes) if record.resumes else None
  return ROW.format(
      job=plan.index, placement=plan.placement, backend=plan.backend,
      fault=plan.fault + ('*' if len(plan.faults) > 1 else ''),
      moment=plan.moment, outcome=record.outcome,
      named=_fmt(record.seconds_to_named),
      first_step=_fmt(record.restart_to_step), redone=_fmt(redone, 'd'),
      goodput=_fmt(record.goodput, '.2f'), drift=_fmt(record.drift, '.2f'),
      broken='; '.join(broken_invariants(record)) or 'ok')


HEADER = ROW.format(job='#', placement='placement', backend='backend',
                    fault='fault', moment='moment', outcome='outcome',
                    named='named', first_step='1st', redone='redone',
                    goodput='goodput', drift='drift', broken='invariants')


def summary_table(records: Sequence[JobRecord]) -> List[str]:
  """placement x backend x fault: jobs, ended well, named, hangs, left
  processes, lost data, medians."""
  groups = collections.defaultdict(list)
  for record in records:
    plan = record.plan
    groups[(plan.placement, plan.backend, plan.fault)].append(record)
  lines = ['placement  backend                fault             jobs well '
           'named hang left lost  med_named med_1st med_redone goodput']
  median = lambda values: (statistics.median(values) if values else None)
  for (placement, backend, fault), group in sorted(groups.items()):
    lines.append(
        f'{placement:<10} {backend:<22} {fault:<17} {len(group):>4} '
        f'{sum(r.outcome in ENDED_WELL and not broken_invariants(r) for r in group):>4} '
        f'{sum(r.outcome == "named" for r in group):>5} '
        f'{sum(r.outcome == "HANG" for r in group):>4} '
        f'{sum(bool(r.left_processes) for r in group):>4} '
        f'{sum(bool(check_data(r)) for r in group):>4}  '
        f'{_fmt(median([r.seconds_to_named for r in group if r.seconds_to_named is not None])):>9} '
        f'{_fmt(median([r.restart_to_step for r in group if r.restart_to_step is not None])):>7} '
        f'{_fmt(median([sum(a - b for a, b in r.resumes) for r in group if r.resumes])):>10} '
        f'{_fmt(median([r.goodput for r in group if r.goodput is not None]), ".2f"):>7}')
  return lines


def _say(line: str) -> None:
  print(line, flush=True)


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    print(f'error: {message} (see --help)', file=sys.stderr)
    sys.exit(2)


def _names(text: str, allowed: Sequence[str], flag: str) -> List[str]:
  names = [n for n in text.split(',') if n]
  bad = [n for n in names if n not in allowed]
  if bad or not names:
    print(f'error: {flag} {text!r}: choose from {",".join(allowed)}',
          file=sys.stderr)
    sys.exit(2)
  return names


def main(argv: Sequence[str]) -> int:
  parser = _Parser(prog='python -m testbed.soak', description=__doc__)
  parser.add_argument('--seed', type=int, required=True,
                      help='draws every job\'s placement, backend, fault, '
                      'moment and delay')
  parser.add_argument('--jobs', type=int, default=4, help='faulted jobs')
  parser.add_argument('--placements', default=','.join(PLACEMENTS),
                      help='comma-separated, of ' + ','.join(PLACEMENTS))
  parser.add_argument('--backends', default=','.join(BACKENDS),
                      help='comma-separated, of ' + ','.join(BACKENDS))
  parser.add_argument('--steps', default=','.join(map(str, STEP_CHOICES)),
                      help='the training steps a job may get, '
                      'comma-separated (each needs one uninterrupted '
                      'reference run per placement and backend)')
  parser.add_argument('--out', help='a file to write one JSON line per job')
  parser.add_argument('--no_reference', action='store_true',
                      help='skip the uninterrupted runs the weights are '
                      'compared with')
  flags = parser.parse_args(argv)
  placements = _names(flags.placements, PLACEMENTS, '--placements')
  backends = _names(flags.backends, BACKENDS, '--backends')
  try:
    steps = [int(n) for n in flags.steps.split(',')]
  except ValueError:
    steps = []
  if not steps or min(steps) < 16 or any(n % 4 for n in steps):
    parser.error(f'--steps {flags.steps!r}: give multiples of 4, at least 16')
  if flags.jobs < 1:
    parser.error(f'--jobs must be >= 1, got {flags.jobs}')
  if os.geteuid() != 0:
    print('error: the soak builds network namespaces and mounts: run it as '
          'root', file=sys.stderr)
    return 2
  plans = draw_plan(flags.seed, flags.jobs, placements, backends, steps)
  return run_plans(plans, use_slurm='slurm' in placements,
                   compare_weights=not flags.no_reference, out=flags.out)


def run_plans(plans: Sequence[JobPlan], use_slurm: bool,
              compare_weights: bool = True, out: Optional[str] = None,
              cluster=None, slurm=None) -> int:
  """Runs `plans` on a new cluster (or `cluster`, `slurm`); prints the rows
  and the table; 1 if an invariant broke."""
  from testbed import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from testbed import slurm as slurm_lib  # pylint: disable=g-import-not-at-top
  own = cluster is None
  if own:
    cluster = cluster_lib.Cluster(
        WORKERS, state_dir=f'/run/resnet_keras_soak_{os.getpid()}',
        subnet_index=250 + os.getpid() % 5).start()
  soak = None
  records = []
  try:
    if use_slurm and slurm is None:
      slurm = slurm_lib.SlurmCluster(cluster).start()
    soak = Soak(cluster, slurm, compare_weights=compare_weights)
    _say(HEADER)
    for plan in plans:
      try:
        record = soak.run_job(plan)
      except Exception as e:  # pylint: disable=broad-except
        # The soak's own failure: said, and the next job still runs.
        record = JobRecord(plan, outcome='soak error',
                           last_line=f'{type(e).__name__}: {e}')
      records.append(record)
      _say(row(record))
      if record.outcome == 'HANG':
        _say('    log tail:\n    ' + record.log_tail.replace('\n', '\n    '))
      if out:
        with open(out, 'a') as f:
          f.write(json.dumps(dataclasses.asdict(record)) + '\n')
  finally:
    if soak is not None:
      soak.close()
    if own:
      if slurm is not None:
        slurm.stop()
      cluster.stop()
  for line in summary_table(records):
    _say(line)
  broken = [r for r in records if broken_invariants(r)]
  _say(f'{len(records)} jobs, {len(broken)} with a broken invariant')
  return 1 if broken else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
