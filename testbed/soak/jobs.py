"""Starting, watching and ending a soak job (runner.py) under each
placement: this host and ssh hosts (the launcher, a process on the
cluster's first host) and Slurm (a batch job); the job's processes on
every host, found, signalled and cleared.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from testbed.soak.plan import FAILURE_TIMEOUT, JobPlan, WORKERS, max_restarts

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DEMO = os.path.join(REPO_ROOT, 'demo_resnet_keras.py')
TRAINER = 'resnet_ctl_imagenet_main.py'
# Seconds the job's processes get to be gone once it ended and every link
# is back (Slurm's slurmd, reconnected, ends what it ran for an ended job).
LEFT_GRACE = 30


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


def slurm_field(text: str, name: str) -> Optional[str]:
  """The value of `name`= in scontrol's answer (None: not there)."""
  found = re.search(rf'\b{name}=(\S+)', text)
  return found.group(1) if found else None


class Jobs:
  """A job's command, start, state and end, whatever its placement."""

  def __init__(self, cluster, slurm=None):
    self.cluster = cluster
    self.slurm = slurm

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
        '--enable_checkpoint_and_export',
        f'--failure_timeout={FAILURE_TIMEOUT}',
        f'--model_dir={model_dir}', '--use_synthetic_data',
        '--resnet_depth=10', '--width_multiplier=0.25', '--image_size=32',
        '--num_classes=10', '--steps_per_loop=2', '--log_steps=2',
        '--num_eval_examples=13', '--noplots']
    if not reference:
      args.append(f'--max_restarts={max_restarts(plan)}')
      if plan.placement != 'this_host':
        args.append('--min_hosts=2')
    else:
      # No fault is planned for it, but the machine's own can come (once a
      # rank's segfault in MPI's start-up under srun, beside two busy
      # processes): one restart, which resumes exactly, keeps the weights
      # the soak compares with; a reference that still fails fails the job.
      args.append('--max_restarts=1')
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
    return slurm_field(answer.stdout, 'JobState') or 'GONE'

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
      if not job_pids(self.cluster, (f'slurmstepd: [{job}.',)):
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

  def stop(self, plan: JobPlan, job) -> None:
    if plan.placement == 'slurm':
      self.slurm.run(['scancel', job])
    elif job.poll() is None:
      job.kill()
      job.wait(timeout=30)

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


# Every process a job runs, on any host: the launcher, workers, MPI's and
# Slurm's launchers, data servers.
JOB_PATTERNS = (TRAINER, 'demo_resnet_keras', 'orted', 'mpirun', 'srun',
                'resnet_keras.data.service', 'prterun', 'prted')


def job_pids(cluster, patterns=JOB_PATTERNS) -> Dict[str, List[int]]:
  """host name -> the PIDs there whose command line matches a pattern."""
  found = {}
  for host in cluster.hosts:
    pids = sorted({pid for pattern in patterns
                   for pid in cluster.processes(host, pattern)})
    if pids:
      found[host.name] = pids
  return found


def cmdline(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace')[:80]
  except OSError:
    return str(pid)


class Processes:
  """The soak's hand on a job's processes, on every host of the cluster:
  its ranks signalled (and the frozen ones resumed), what is left after
  it, killed."""

  def __init__(self, cluster):
    self.cluster = cluster
    self._stopped: List[int] = []

  def ranks(self, plan: JobPlan) -> List[int]:
    """The trainer's PIDs, rank order where the host order gives it (the
    python processes: not mpirun's, ssh's or srun's command lines)."""
    hosts = (self.cluster.hosts[:1] if plan.placement == 'this_host' else
             self.cluster.hosts)
    pids = []
    for host in hosts:
      pids += [pid for pid in sorted(self.cluster.processes(host, TRAINER))
               if 'python' in cmdline(pid).split(' ')[0]]
    return pids

  def signal_rank(self, plan: JobPlan, sig: int) -> Tuple[Optional[int], str]:
    """(the victim rank's PID, what was done): no PID where no signal was
    sent."""
    ranks = self.ranks(plan)
    if not ranks:
      return None, 'no rank running'
    pid = ranks[plan.victim % len(ranks)]
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      return None, f'rank pid {pid} already gone'
    if sig == signal.SIGSTOP:
      self._stopped.append(pid)
    return pid, f'pid {pid}'

  def resume_stopped(self) -> None:
    for pid in self._stopped:
      try:
        os.kill(pid, signal.SIGCONT)
      except ProcessLookupError:
        pass
    self._stopped = []

  def leftovers(self) -> Dict[str, List[str]]:
    """The job's processes that outlive it by LEFT_GRACE s (then killed)."""
    deadline = time.monotonic() + LEFT_GRACE
    while job_pids(self.cluster) and time.monotonic() < deadline:
      time.sleep(0.5)  # Processes being reaped: polled.
    found = {host: [cmdline(pid) for pid in pids]
             for host, pids in job_pids(self.cluster).items()}
    self.kill_all()
    return found

  def kill_all(self) -> None:
    for pids in job_pids(self.cluster).values():
      for pid in pids:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
