"""What --batch_size counts, written once: a program's batch, where a
program is a process that feeds its own replicas. Under Horovod every
worker is a program, so --batch_size is per worker; a tf.distribute job is
one program whose strategy spans every replica of every worker, so
--batch_size is the job's global batch. The trainer's plan (plan.py) and
its record of the job's shape (world.py), the launcher's checks and its
elastic layouts (launcher/job.py, launcher/elastic.py), and the backend
(distribution.py) all go through it.
"""

import dataclasses

from common.errors import UsageError


def global_batch(batch_size: int, programs: int) -> int:
  """The job's batch per optimizer step: --batch_size for each program."""
  return batch_size * programs


def worker_batch(global_batch_size: int, workers: int) -> int:
  """Each worker's share of the global batch."""
  return global_batch_size // workers


@dataclasses.dataclass(frozen=True)
class BatchRule:
  """--batch_size on a job of `workers` workers under Horovod or not."""
  workers: int
  horovod: bool

  @property
  def programs(self) -> int:
    return self.workers if self.horovod else 1

  def global_batch(self, batch_size: int) -> int:
    return global_batch(batch_size, self.programs)

  def worker_batch(self, batch_size: int) -> int:
    return worker_batch(self.global_batch(batch_size), self.workers)

  def batch_size(self, each_worker: int) -> int:
    """The --batch_size that gives every worker `each_worker` examples."""
    return each_worker * self.workers // self.programs

  def check(self, batch_size: int) -> None:
    """UsageError where `batch_size` does not split evenly over the
    workers (a global batch, under tf.distribute)."""
    if self.global_batch(batch_size) % self.workers:
      suggestion = self.workers * max(1, batch_size // self.workers)
      raise UsageError(
          f'--batch_size={batch_size} is the global batch under '
          f'tf.distribute and must be a multiple of the {self.workers} '
          f'workers; use e.g. --batch_size={suggestion}')
