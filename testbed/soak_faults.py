"""What each fault of the soak's catalogue (soak_plan.CATALOGUE) does to a
running job (testbed/soak.py)."""

import os
import re
import signal
import time
from typing import List

from testbed.soak_invariants import JobRecord
from testbed.soak_jobs import Processes
from testbed.soak_plan import JobPlan


def _truncate_newest(model_dir: str) -> List[str]:
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


def inject(cluster, slurm, processes: Processes, plan: JobPlan, fault: str,
           job, model_dir: str, record: JobRecord, timers: List) -> str:
  """Does `fault` to `job` (the launcher's process, or a Slurm job id) on
  `cluster` (and its `slurm`); appends to `timers` the (when, action)
  pairs that undo a passing fault. Returns what it did (for the log)."""
  host = cluster.hosts[plan.victim]
  if fault == 'kill_rank':
    return processes.signal_rank(plan, signal.SIGKILL)
  if fault == 'freeze_rank':
    return processes.signal_rank(plan, signal.SIGSTOP)
  if fault == 'pause_rank':
    done = processes.signal_rank(plan, signal.SIGSTOP)
    timers.append((time.monotonic() + 3, processes.resume_stopped))
    return done
  if fault == 'cut_link':
    cluster.cut_link(host)
    return host.name
  if fault == 'flap_link':
    cluster.cut_link(host)
    timers.append((time.monotonic() + 20,
                   lambda: cluster.restore_link(host)))
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
    done = processes.signal_rank(plan, signal.SIGKILL)
    record.truncated = _truncate_newest(model_dir)
    return f'{done}; truncated {", ".join(record.truncated) or "nothing"}'
  if fault == 'slurm_usr1':
    return slurm.run(['scancel', '--signal=USR1', job]).stderr
  if fault == 'slurm_requeue':
    return slurm.run(['scontrol', 'requeue', job]).stderr
  if fault == 'slurm_cancel_step':
    steps = slurm.run(['squeue', '-h', '-s', '-j', job,
                            '-o', '%i']).stdout.split()
    numbered = [s for s in steps if re.fullmatch(r'\d+\.\d+', s)]
    if not numbered:
      return 'no step running'
    return slurm.run(['scancel', numbered[-1]]).stderr or numbered[-1]
  if fault == 'slurm_node_down':
    return slurm.run(['scontrol', 'update', f'nodename={host.name}',
                           'state=down', 'reason=soak']).stderr or host.name
  raise ValueError(fault)
