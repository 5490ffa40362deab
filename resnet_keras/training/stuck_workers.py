"""The stuck-worker watchdog of a run, wired: a worker of a job of several
ends itself, in one line naming the wait, once the job's collectives have
not moved for longer than their deadline (watchdog.py: the thread, the
deadlines, the line), so that the launcher sees the job fail and restarts
it. The deadline's ceiling is what the launcher hands the worker
(worker_contract.stuck_worker_timeout); a single worker, or one started
without a launcher, waits."""

import contextlib
import os
from typing import Callable, Iterator, List, Tuple

from common import worker_contract
from resnet_keras.engine import distribution
from resnet_keras.training import goodput
from resnet_keras.training import watchdog
from resnet_keras.config import RunConfig


@contextlib.contextmanager
def watched(cfg: RunConfig, worker: int) -> Iterator[
    Tuple[distribution.Progress, List[Callable[[], None]]]]:
  """Watches the job's collectives while the block runs. Yields the
  `Progress` the backend must report to, and `last_words`: what the
  worker does first when it ends itself stuck (the block appends to it)."""
  # Watched from before the backend is built: the workers' joining waits
  # for every one of them (a worker frozen while it started, as on a
  # restart, held the others there for good).
  timeout = _stuck_worker_timeout(cfg)
  progress = distribution.Progress(
      joining_watch=lambda: watchdog.watched_from_outside(
          timeout, watchdog.stuck_line(
              worker, timeout, 'the joining deadline, 10 x --failure_timeout')),
      stall=goodput.stalled_seconds)
  deadlines = watchdog.Deadlines(
      progress, timeout,
      step_floor=cfg.tf_data_service_timeout if cfg.tf_data_service else 0)
  last_words = []  # The chief's goodput account, once it has one.
  stuck = watchdog.Watchdog(
      timeout, progress.waiting_since,
      watchdog.end_stuck_worker(worker, deadlines, last_words),
      deadline=deadlines.now).start()
  try:
    yield progress, last_words
  finally:
    stuck.stop()


def _stuck_worker_timeout(cfg: RunConfig) -> float:
  """Seconds a worker waits on the others' collectives before it ends
  itself (0: it waits; one worker, or no launcher set one)."""
  if not worker_contract.several_workers(os.environ):
    return 0
  return worker_contract.stuck_worker_timeout(
      os.environ, use_horovod=cfg.use_horovod) or 0
