"""The launcher on a test cluster (testbed/cluster.py), as a user runs it:
started on the first host, its output in a log file the test polls."""

import os
import re
import subprocess
import sys
import time

from tests.support import deadlines
from tests.support import runner

DEMO = os.path.join(runner.REPO_ROOT, 'demo_resnet_keras.py')
# ResNet-10: every rank of a job shares this machine's 2 cores.
TINY = ['--resnet_depth=10' if a.startswith('--resnet_depth') else a
        for a in runner.TINY if not a.startswith(('--batch_size',
                                                  '--train_steps'))]
TRAINER = 'resnet_ctl_imagenet_main.py'


def start(cluster, args, log_path, env=None):
  """The launcher on the first host; its output to `log_path`."""
  environ = {**cluster.launcher_env(dict(os.environ)), **(env or {})}
  log = open(log_path, 'w')
  job = cluster.popen(cluster.hosts[0], [sys.executable, DEMO] + args,
                      env=environ, cwd=runner.REPO_ROOT, stdout=log,
                      stderr=subprocess.STDOUT)
  log.close()
  return job


def run(cluster, args, log_path, timeout=400, env=None):
  """(exit code, output) of the launcher run to its end."""
  job = start(cluster, args, log_path, env)
  try:
    returncode = job.wait(timeout=deadlines.stretched(timeout))
  finally:
    if job.poll() is None:
      job.kill()
  return returncode, open(log_path).read()


def _log(log_path):
  """The log so far ('' before its job has written it: a Slurm job's
  output file appears once the job starts)."""
  return open(log_path).read() if os.path.exists(log_path) else ''


def wait_for_line(job, log_path, text, timeout=300):
  """Once `text` is in the log (`job`: the launcher's process, which must
  not end first; None: a Slurm job, with no process here to watch)."""
  deadline = time.monotonic() + deadlines.stretched(timeout)
  while text not in _log(log_path):
    assert job is None or job.poll() is None, _log(log_path)[-3000:]
    assert time.monotonic() < deadline, f'no "{text}" in the log'
    time.sleep(0.5)  # Polls a log file for a line; not a guessed wait.


def last_step(log_path):
  steps = re.findall(r' I step (\d+)/', _log(log_path))
  return int(steps[-1]) if steps else 0


def wait_for_step(job, log_path, step, timeout=300):
  deadline = time.monotonic() + deadlines.stretched(timeout)
  while last_step(log_path) < step:
    assert job is None or job.poll() is None, _log(log_path)[-3000:]
    assert time.monotonic() < deadline, _log(log_path)[-3000:]
    time.sleep(0.5)  # Polls a log file for a step; not a guessed wait.
  return last_step(log_path)


# A job's processes on the hosts: its ranks and MPI daemons (the launcher,
# too, where it runs on a host the test watches: a Slurm batch script).
RANKS = (TRAINER, 'orted')


def job_processes(cluster, patterns=RANKS):
  """host name -> PIDs of the job's processes (`patterns` in their
  command lines)."""
  found = {}
  for host in cluster.hosts:
    pids = [pid for pattern in patterns
            for pid in cluster.processes(host, pattern)]
    if pids:
      found[host.name] = pids
  return found


def wait_until_no_job_processes(cluster, timeout=10, patterns=RANKS):
  deadline = time.monotonic() + timeout
  while job_processes(cluster, patterns) and time.monotonic() < deadline:
    time.sleep(0.5)  # Processes being reaped; polled, not a guessed wait.
  return job_processes(cluster, patterns)


def summaries(model_dir, num_workers):
  """Each worker's run_summary.json (the chief's in model_dir)."""
  return [runner.read_summary(os.path.join(model_dir, *(
      [] if worker == 0 else [f'worker_{worker}'])))
          for worker in range(num_workers)]


def error_lines(output):
  """Lines a user would read as a failure."""
  return [line for line in output.splitlines()
          if re.search(r'\berror\b|UNAVAILABLE|cuInit|Traceback', line,
                       re.IGNORECASE)]
