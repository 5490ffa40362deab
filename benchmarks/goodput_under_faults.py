"""Goodput of a long job hit by a fault every few minutes, per backend.

Runs one job per backend on the suite's three-host namespace cluster (ssh
hosts, one worker each; testbed/cluster.py), the soak's tiny synthetic
ResNet (testbed/soak/jobs.py), long enough for about `--minutes` of
training, kills a rank (`kill -9`, a worker other than the chief) every
`--every` seconds, and prints the run's goodput block (run_summary.json)
split into its parts. As root (namespaces), with nothing else running:

  python -m benchmarks.goodput_under_faults --minutes 10 --every 120

--trainer_checkpoints leaves the checkpoint interval to the trainer's
default (epoch ends, and by time: training/timed_saves.py).
"""

import argparse
import dataclasses
import json
import os
import re
import signal
import sys
import tempfile
import time

from resnet_keras.training import goodput as goodput_lib
from testbed import cluster as cluster_lib
from testbed.soak import runner as soak_lib
from testbed.soak import jobs as soak_jobs
from testbed.soak import plan as soak_plan

# Steps of the speed probe: enough step lines past tracing and warm-up.
PROBE_STEPS = 200
# A chief's step line: its clock and step.
_STEP_LINE = re.compile(r'(\d\d:\d\d:\d\d) I step (\d+)/')
_PARTS = goodput_lib.PARTS


def with_flags(args, **values):
  """`args` with each --name=value of `values` set (replaced or added)."""
  name = lambda arg: (re.match(r'--(\w+)', arg) or [None, None])[1]
  kept = [a for a in args if name(a) not in values]
  return kept + [f'--{name}={value}' for name, value in values.items()]


def job_args(soak, plan, model_dir, restarts, steps_interval=True):
  """The long job's flags: the soak's, with loops, logs and checkpoints
  spaced for thousands of steps (`steps_interval`: a checkpoint every
  thirtieth of the job; else the trainer's default, epoch ends and its
  interval by time)."""
  args = with_flags(soak.jobs.args(plan, model_dir, reference=True),
                    checkpoint_interval_steps=max(20, plan.steps // 30),
                    max_checkpoints=3, max_restarts=restarts,
                    log_steps=20, steps_per_loop=10)
  if not steps_interval:
    args = [a for a in args if not a.startswith('--checkpoint_interval_steps')]
  return args


def steps_per_second(soak, plan, work_dir) -> float:
  """The layout's training speed with the long job's own flags, from the
  chief's step lines after the first two (tracing and warm-up)."""
  probe = dataclasses.replace(plan, steps=PROBE_STEPS)
  model_dir = os.path.join(work_dir, f'probe_{plan.backend}')
  log = soak_jobs.Log(os.path.join(work_dir, f'probe_{plan.backend}.txt'))
  job = soak.jobs.start(probe, job_args(soak, probe, model_dir, restarts=0),
                   log.path)
  soak.jobs.wait_for_end(probe, job, log, time.monotonic() + 900)
  soak.heal()
  return speed_from_log(open(log.path).read())


def speed_from_log(text: str) -> float:
  """Steps per second between the third step line and the last."""
  stamped = [(_clock(m.group(1)), int(m.group(2)))
             for m in _STEP_LINE.finditer(text)]
  if len(stamped) < 4:
    raise RuntimeError(f'the probe logged {len(stamped)} step lines; '
                       'need at least 4')
  (start, first), (end, last) = stamped[2], stamped[-1]
  return (last - first) / max((end - start) % 86400, 1)  # Past midnight too.


def _clock(hms: str) -> int:
  hours, minutes, seconds = map(int, hms.split(':'))
  return hours * 3600 + minutes * 60 + seconds


def run(soak, backend, minutes, every, work_dir, steps_interval=True):
  plan = soak_plan.JobPlan(index=0, placement='ssh', backend=backend,
                          faults=(), delay=0.0, victim=1, steps=PROBE_STEPS)
  speed = steps_per_second(soak, plan, work_dir)
  steps = int(speed * minutes * 60) // 20 * 20
  plan = dataclasses.replace(plan, steps=steps)
  model_dir = os.path.join(work_dir, f'job_{backend}')
  args = job_args(soak, plan, model_dir,
                  restarts=int(minutes * 60 // every) + 2,
                  steps_interval=steps_interval)
  log = soak_jobs.Log(os.path.join(work_dir, f'job_{backend}.txt'))
  started = time.monotonic()
  job = soak.jobs.start(plan, args, log.path)
  kills = 0
  next_fault = started + every
  while soak.jobs.ended(plan, job) is None:
    log.poll()
    if time.monotonic() >= next_fault:
      _, done = soak.processes.signal_rank(plan, signal.SIGKILL)
      kills += 1
      print(f'  {backend}: kill -9 of a rank at '
            f'{time.monotonic() - started:.0f} s ({done})', flush=True)
      next_fault += every
    if time.monotonic() > started + minutes * 60 * 4:
      soak.jobs.stop(plan, job)
      print(f'  {backend}: not ended within {minutes * 4} minutes: stopped')
      break
    time.sleep(0.5)
  soak.heal()
  summary_path = os.path.join(model_dir, 'run_summary.json')
  if not os.path.exists(summary_path):
    return backend, steps, kills, None
  return backend, steps, kills, json.load(open(summary_path)).get('goodput')


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--minutes', type=float, default=10,
                      help='the uninterrupted training time to aim for')
  parser.add_argument('--every', type=float, default=120,
                      help='seconds between faults')
  parser.add_argument('--backends', default=','.join(soak_plan.BACKENDS))
  parser.add_argument('--trainer_checkpoints', action='store_true',
                      help='no --checkpoint_interval_steps: the trainer\'s '
                      'default (epoch ends, and by time)')
  flags = parser.parse_args(argv)
  if os.geteuid() != 0:
    print('error: run as root (the cluster is network namespaces)',
          file=sys.stderr)
    return 2
  from resnet_keras.config import hardware  # pylint: disable=g-import-not-at-top
  print(f'machine: {hardware.this_cpu().describe()}')
  work_dir = tempfile.mkdtemp(prefix='resnet_keras_goodput_')
  cluster = cluster_lib.Cluster(
      soak_plan.WORKERS, state_dir=f'/run/resnet_keras_goodput_{os.getpid()}',
      subnet_index=245 + os.getpid() % 5).start()
  results = []
  try:
    soak = soak_lib.Soak(cluster, work_dir=work_dir)
    for backend in flags.backends.split(','):
      results.append(run(soak, backend, flags.minutes, flags.every, work_dir,
                         steps_interval=not flags.trainer_checkpoints))
  finally:
    cluster.stop()
  print(f'{"backend":<22} {"steps":>6} {"kills":>5} {"wall s":>7} '
        f'{"goodput":>7}  ' + ' '.join(f'{p:>11}' for p in _PARTS))
  for backend, steps, kills, goodput in results:
    if goodput is None:
      print(f'{backend:<22} {steps:>6} {kills:>5}  no run_summary.json')
      continue
    seconds = goodput['seconds']
    print(f'{backend:<22} {steps:>6} {kills:>5} {goodput["wall_seconds"]:>7.0f} '
          f'{goodput["goodput"]:>7.2f}  ' +
          ' '.join(f'{seconds.get(p, 0):>11.1f}' for p in _PARTS))
  print(f'(work files: {work_dir})')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
