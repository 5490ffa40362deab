"""Elastic jobs: the batch a job keeps when it goes on with fewer (or again
more) hosts, and the one line that says so. Pure functions of their
arguments; the launcher's job (resnet_keras/launcher/job.py) checks the
hosts and restarts the job.

A run is planned for every host of MULTI_HLS_IPS: its global batch G is
workers x per-worker batch (Horovod's --batch_size; tf.distribute's
--batch_size is G itself: common/batch_rule.py), and gradient accumulation splits each worker's
batch into micro-batches of m. On W' workers:

  keep   (default) G stays: each worker takes G / W', in the fewest
         micro-batches of at most m (memory holds what it held), so the
         schedule, its steps and the result stay those of the planned run.
         W' must divide G.
  scale  each worker keeps its batch (and micro-batches): the job's global
         batch becomes G' = G W' / W, and the trainer gets
         --planned_global_batch=G, which keeps the planned steps and
         schedule and scales the learning rate by G'/G (linear scaling).
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

from common.batch_rule import BatchRule
from common.errors import UsageError

KEEP, SCALE = 'keep', 'scale'
MODES = (KEEP, SCALE)
# The trainer's flags a layout sets (with their short aliases).
BATCH_FLAGS = ('batch_size', 'bs', 'num_accumulation_steps',
               'planned_global_batch')


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a job runs and how its global batch is split."""
  hosts: Tuple[str, ...]
  workers: int  # In all: hosts x workers per host.
  worker_batch: int  # Examples per worker per optimizer step.
  micro_batches: int  # --num_accumulation_steps
  planned_global_batch: int  # The batch the run was planned for.

  @property
  def global_batch(self) -> int:
    return self.workers * self.worker_batch

  @property
  def lr_scale(self) -> float:
    return self.global_batch / self.planned_global_batch

  def trainer_flags(self, horovod: bool) -> List[str]:
    """The trainer's batch flags for this layout."""
    batch_size = BatchRule(self.workers, horovod).batch_size(self.worker_batch)
    flags = [f'--batch_size={batch_size}',
             f'--num_accumulation_steps={self.micro_batches}']
    if self.global_batch != self.planned_global_batch:
      flags.append(f'--planned_global_batch={self.planned_global_batch}')
    return flags

  def describe(self) -> str:
    return (f'{len(self.hosts)} host(s), {self.workers} worker(s) x batch '
            f'{self.worker_batch} in {self.micro_batches} micro-batch(es) = '
            f'global batch {self.global_batch}')


def planned_layout(hosts: Sequence[str], workers_per_host: int,
                   batch_size: int, micro_batches: int,
                   horovod: bool) -> Layout:
  """The layout the command line plans: every host, the batch as given."""
  workers = max(1, len(hosts)) * workers_per_host
  worker_batch = BatchRule(workers, horovod).worker_batch(batch_size)
  return Layout(hosts=tuple(hosts), workers=workers, worker_batch=worker_batch,
                micro_batches=micro_batches,
                planned_global_batch=worker_batch * workers)


def relayout(planned: Layout, hosts: Sequence[str], workers_per_host: int,
             mode: str) -> Optional[Layout]:
  """`planned` on `hosts` (None: `keep` has no split for that count)."""
  workers = len(hosts) * workers_per_host
  if mode == SCALE:
    return dataclasses.replace(planned, hosts=tuple(hosts), workers=workers)
  if not keeps_batch(planned, workers):
    return None
  worker_batch = planned.planned_global_batch // workers
  micro = planned.worker_batch // planned.micro_batches
  micro_batches = next(n for n in range(1, worker_batch + 1)
                       if worker_batch % n == 0 and worker_batch // n <= micro)
  return Layout(hosts=tuple(hosts), workers=workers, worker_batch=worker_batch,
                micro_batches=micro_batches,
                planned_global_batch=planned.planned_global_batch)


def describe_layouts(planned: Layout, min_hosts: int, workers_per_host: int,
                     mode: str, horovod: bool) -> List[str]:
  """--dry_run's lines: the layout on each host count the job may shrink
  to, with the trainer's batch flags there."""
  lines = []
  for count in range(len(planned.hosts) - 1, min_hosts - 1, -1):
    layout = relayout(planned, planned.hosts[:count], workers_per_host, mode)
    lr = (f', learning rate x{layout.lr_scale:.4g}'
          if layout.lr_scale != 1 else '')
    lines.append(f'elastic: on {layout.describe()}{lr}: '
                 f'{" ".join(layout.trainer_flags(horovod))}')
  return lines


def keeps_batch(planned: Layout, workers: int) -> bool:
  """Whether `keep` splits `planned`'s global batch over `workers`."""
  return planned.planned_global_batch % workers == 0


def min_hosts(flag: int, hosts: Sequence[str], source: str) -> int:
  """--min_hosts (0: every host of `source`), checked against them."""
  if flag and not hosts:
    raise UsageError('--min_hosts needs several hosts in MULTI_HLS_IPS')
  if flag > len(hosts):
    raise UsageError(f'--min_hosts={flag} is more than the {len(hosts)} '
                     f'hosts of {source}')
  return flag or len(hosts)


def check_host_counts(planned: Layout, min_hosts: int, workers_per_host: int,
                      mode: str) -> None:
  """Refuses, before anything runs, a --min_hosts that lets the job shrink
  to a host count that cannot keep the global batch."""
  if mode != KEEP:
    return
  # The count alone decides: no layout built per count (1,000 hosts made
  # 1,000 of them, each copying its hosts).
  keeps = {n: keeps_batch(planned, n * workers_per_host)
           for n in range(1, len(planned.hosts) + 1)}
  failing = [n for n in range(min_hosts, len(planned.hosts) + 1)
             if not keeps[n]]
  if failing:
    working = [n for n, splits in keeps.items() if splits]
    raise UsageError(
        f'the global batch of {planned.planned_global_batch} cannot be split '
        f'evenly over the workers of {_counts(failing)} host(s), which '
        f'--min_hosts={min_hosts} allows; host counts that keep it: '
        f'{_counts(working) or "none"}: raise --min_hosts, change the batch, '
        'or pass --elastic_batch=scale to keep each worker\'s batch instead')


def _counts(numbers: Sequence[int]) -> str:
  return ', '.join(map(str, numbers))


def describe_change(before: Layout, after: Layout, step: Optional[int],
                    lost_seconds: float) -> str:
  """The one line of a shrink or a regrowth."""
  verb = 'shrinks' if len(after.hosts) < len(before.hosts) else 'grows'
  lr = (f', learning rate x{after.lr_scale:.4g} (--elastic_batch=scale)'
        if after.lr_scale != 1 else ' (kept)')
  return (f'elastic: the job {verb} from {len(before.hosts)} to '
          f'{len(after.hosts)} host(s) ({", ".join(after.hosts)}): '
          f'{after.describe()}{lr}; {resuming(step)}; {lost_seconds:.0f} s '
          'lost')


def resuming(step: Optional[int]) -> str:
  """Where an attempt starts, as the launcher's lines say it."""
  return (f'resuming at step {step}' if step is not None else
          'from step 0 (no checkpoint yet)')
