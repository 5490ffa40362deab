"""A randomized fault soak: real tiny jobs on the namespace cluster
(testbed/cluster.py) and its Slurm (testbed/slurm.py), each hit by one or
two faults drawn from a seed at a moment drawn from it, then checked
against invariants.

  python -m testbed.soak --seed 1 --jobs 20 [--placements this_host,ssh,slurm]
      [--backends horovod,multi_worker_mirrored] [--out rows.jsonl]

Root only (network namespaces, tmpfs mounts). One row per job, a summary
table at the end; the exit code is 1 if any invariant broke. This module
runs each job through the package's other modules (__init__.py names
them); report.py says what it found.
"""

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from testbed.soak import evidence
from testbed.soak import faults as soak_faults
from testbed.soak import report
from testbed.soak.invariants import FaultRecord, JobRecord
from testbed.soak.jobs import Jobs, Log, Processes
from testbed.soak.plan import (BACKENDS, PLACEMENTS, STEP_CHOICES, WORKERS,
                               JobPlan, bound_seconds, draw_plan)


def _moment_pattern(moment: str, steps: int, rng: random.Random) -> str:
  if moment == 'startup':
    return r'TF_CONFIG from|plan: global batch'
  if moment == 'mid_step':
    return rf' I step {rng.randrange(3, steps // 2 - 1) * 2}/'
  if moment == 'checkpoint':
    return rf' I step {rng.randrange(1, steps // 4) * 4}/'
  if moment == 'evaluation':
    return rf'saved checkpoint at step {steps}\b'
  if moment == 'export':
    return r'eval at step'
  return r'restart \d+ of|requeued \d+ time'


class Reference(NamedTuple):
  """An uninterrupted run of a layout: what a faulted job is held to."""
  weights: Optional[str]  # weights_sha256 (None: see error)
  seconds: float
  model_dir: Optional[str]
  error: str  # Why it gives no weights ('': it does).


class References:
  """The uninterrupted run of each layout, which the faulted jobs of that
  layout are held to: run on the soak's cluster once per layout.
  `heal`: the cluster as before a job, after each run."""

  def __init__(self, jobs: Jobs, work_dir: str, heal: Callable[[], None]):
    self._jobs, self._work_dir, self._heal = jobs, work_dir, heal
    # (placement, backend, steps) -> the uninterrupted run of that layout.
    self._runs: Dict[Tuple[str, str, int], Reference] = {}

  def of(self, plan: JobPlan) -> Reference:
    """The uninterrupted run of the layout (run once per layout)."""
    key = (plan.placement, plan.backend, plan.steps)
    if key not in self._runs:
      job_dir = tempfile.mkdtemp(dir=self._work_dir, prefix='reference_')
      model_dir = os.path.join(job_dir, 'model')
      clean = dataclasses.replace(plan, faults=())
      log = Log(os.path.join(job_dir, 'log.txt'))
      started = time.monotonic()
      job = self._jobs.start(
          clean, self._jobs.args(clean, model_dir, reference=True), log.path)
      code = self._jobs.wait_for_end(clean, job, log, started + 900)
      seconds = time.monotonic() - started
      if code != 0:
        self._jobs.stop(clean, job)
      summary = evidence.read_summary(model_dir)
      error = evidence.reference_problem(code, summary, plan.steps)
      if error:
        error += f'; its last line: {evidence.last_line(log.lines)!r}'
      self._heal()
      self._runs[key] = Reference(
          None if error else summary['weights_sha256'], seconds, model_dir,
          error)
    return self._runs[key]


class Soak:
  """The cluster (and Slurm) and the faulted jobs run on it, one at a
  time."""

  def __init__(self, cluster, slurm=None, work_dir: Optional[str] = None,
               compare_weights: bool = True):
    self.cluster = cluster
    self.slurm = slurm
    self.jobs = Jobs(cluster, slurm)
    self.processes = Processes(cluster)
    self.work_dir = work_dir or tempfile.mkdtemp(prefix='resnet_keras_soak_')
    self.compare_weights = compare_weights
    self.references = References(self.jobs, self.work_dir, self.heal)
    # TensorFlow, which reads checkpoints, imported before the first job's
    # moment rather than at it.
    from resnet_keras.rundir import checkpoints  # pylint: disable=g-import-not-at-top,unused-import
    self._mounts: List[str] = []

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
    reference = (self.references.of(plan) if self.compare_weights else
                 Reference(None, 150.0, None, ''))
    record = JobRecord(plan, outcome='missed',
                       weights_compared=self.compare_weights,
                       reference_weights=reference.weights,
                       reference_error=reference.error)
    rng = random.Random(f'{plan.index}-{plan.delay}')
    log = Log(os.path.join(job_dir, 'log.txt'))
    started = time.monotonic()
    snapshot = os.path.join(job_dir, 'snapshot')
    job = self.jobs.start(plan, self.jobs.args(plan, model_dir), log.path)
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
          if seen is None and self.jobs.ended(plan, job) is not None:
            break
          time.sleep(0.1)  # Polls the log for the moment.
        if seen is None:  # The job ended, or stalled, before the moment.
          if self.jobs.ended(plan, job) is None:
            record.outcome = 'HANG'
            record.bound = 600
          break
        time.sleep(plan.delay if number == len(plan.faults) - 1 else 0)
        if self.jobs.ended(plan, job) is not None:
          break  # The fault came too late: 'missed'.
        if number == 0:
          record.files_before = evidence.checkpoint_files(model_dir)
          evidence.copy_checkpoints(model_dir, snapshot)
        last_fault = time.monotonic()
        landing = soak_faults.inject(self.cluster, self.slurm,
                                     self.processes, plan, fault, job,
                                     model_dir, record, timers)
        record.faults.append(FaultRecord(fault, moment, last_fault - started,
                                         **landing._asdict()))
        _say(f'  job {plan.index}: {fault} at {moment} '
             f'({last_fault - started:.0f} s): {landing.did}; '
             f'{landing.evidence or "its line awaited"}')
      else:
        record.bound = bound_seconds(plan, reference.seconds)
        code = self.jobs.wait_for_end(plan, job, log,
                                      last_fault + record.bound, timers)
        record.seconds = time.monotonic() - last_fault
        record.outcome = evidence.outcome(code, plan, log.lines)
      log.poll()
      for dealt in record.faults:
        soak_faults.confirm(dealt, evidence.lines_after(log,
                                                        started + dealt.at))
        dealt.recovery = evidence.recovery_seconds(log, started + dealt.at)
      if record.outcome == 'HANG':
        record.log_tail = '\n'.join(log.lines[-30:])
      if record.outcome != 'missed':
        record.readable_before = evidence.readable(snapshot)
        evidence.read_results(record, log, model_dir, last_fault)
        if (record.shrank and record.outcome == 'completed' and
            reference.weights):
          record.drift = evidence.weights_drift(model_dir,
                                                reference.model_dir)
    finally:
      self.jobs.stop(plan, job)
      self.processes.resume_stopped()
      # A host cut off cannot hear that its job ended: what is left there
      # counts once its link is back (as a node's return on a cluster).
      self._reconnect()
      record.left_processes = self.processes.leftovers()
      self.heal()
    return record

  def heal(self) -> None:
    """The cluster as before a job: links up, no firewall, nodes idle,
    the job's processes and tmpfs gone."""
    self._reconnect()
    self.processes.kill_all()
    while self._mounts:
      subprocess.run(['umount', '-l', self._mounts.pop()], check=False)
    if self.slurm is not None:
      for job in self.slurm.run(['squeue', '-h', '-o', '%i']).stdout.split():
        self.slurm.run(['scancel', job])
      try:
        self.slurm.heal()
      except RuntimeError as e:
        _say(f'  Slurm not idle after the job: {e}')

  def _reconnect(self) -> None:
    for host in self.cluster.hosts:
      self.cluster.restore_link(host)
      self.cluster.clear_firewall(host)

  def close(self) -> None:
    self.heal()
    shutil.rmtree(self.work_dir, ignore_errors=True)


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
    _say(report.HEADER)
    for plan in plans:
      try:
        record = soak.run_job(plan)
      except Exception as e:  # pylint: disable=broad-except
        # The soak's own failure: said, and the next job still runs.
        record = JobRecord(plan, outcome='soak error',
                           last_line=f'{type(e).__name__}: {e}')
      records.append(record)
      _say(report.row(record))
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
  for line in report.summary_table(records):
    _say(line)
  line, code = report.verdict(records, compare_weights)
  _say(line)
  return code
