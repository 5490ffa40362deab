"""A slow worker, named: one whose own part of each step took SLOW_MARGIN
longer than the other workers' for a sustained stretch of training.

In a synchronous job every worker's step lasts as long as the slowest
worker's (the others wait for it in the step's collectives), so step times
cannot tell which worker is slow. What each worker computes before the
step's first collective can: its input and forward pass
(objective.Objective.gradients). Each loop ends with the workers
exchanging that time per step (distribution.Backend.each_worker), so every
worker holds them all; the chief says it in the log, and every worker's
run_summary.json has it.
"""

import collections
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from resnet_keras.engine.metrics import LOOP_RECORD

# At least 10% over the others' median...
SLOW_MARGIN = 0.10
# ...in the median loop of the last 30 s of training: longer than a pause
# or a busy moment of its host (and the median loop, not every loop: one
# loop's own time is a few steps', noisy on a busy host), short enough to
# be named in a 10-minute job.
SUSTAINED_SECONDS = 30.0

# (seconds, first step, each worker's own time per step) of one loop.
Loop = Tuple[float, int, Sequence[float]]


def slow_workers(loops: Sequence[Loop], margin: float = SLOW_MARGIN,
                 sustained: float = SUSTAINED_SECONDS) -> Dict[int, float]:
  """The workers whose own time per step was at least `margin` over the
  median of the other workers' in the median loop of the latest `loops`
  (oldest first) that together last `sustained` seconds, each with that
  median excess (0.25: 25% over); none while the loops last less."""
  window, total = [], 0.0
  for seconds, _, times in reversed(loops):
    window.append(np.asarray(times, dtype=float))
    total += seconds
    if total >= sustained:
      break
  else:
    return {}
  slow = {}
  for worker in range(len(window[0])):
    excess = np.median([times[worker] / np.median(np.delete(times, worker))
                        - 1 for times in window])
    if excess >= margin:
      slow[worker] = float(excess)
  return slow


class SlowWorkers:
  """Train action: follows each worker's own time per step (every worker
  holds them all) and says when a worker becomes slow and when it is no
  longer (`log`: the chief); `summary()` for run_summary.json."""

  def __init__(self, log: bool):
    self._log = log
    self._loops: Deque[Loop] = collections.deque()
    self._steps = 0
    self._own = None  # Each worker's own seconds over the steps so far.
    self._slow: Dict[int, Dict] = {}  # The episodes in progress.
    self._episodes: List[Dict] = []

  def __call__(self, output: Dict) -> None:
    loop = output[LOOP_RECORD]
    steps = len(loop.losses)
    if not steps or loop.own_step_seconds is None:
      return
    times = np.asarray(loop.own_step_seconds, dtype=float)
    self._steps += steps
    self._own = steps * times + (0 if self._own is None else self._own)
    if len(times) < 2:
      return
    self._loops.append((loop.seconds, loop.first_step, times))
    # Only the latest SUSTAINED_SECONDS of loops are ever read.
    while sum(s for s, _, _ in list(self._loops)[1:]) >= SUSTAINED_SECONDS:
      self._loops.popleft()
    self._update(slow_workers(self._loops), loop.first_step + steps - 1)

  def _update(self, slow: Dict[int, float], step: int) -> None:
    for worker, excess in slow.items():
      episode = self._slow.get(worker)
      if episode is None:
        since = self._loops[0][1]
        episode = self._slow[worker] = {'worker': worker, 'from_step': since,
                                        'to_step': step, 'over_median': 0.0}
        self._episodes.append(episode)
        if self._log:
          logging.warning(
              'worker %d is slow: its own part of each step (input and '
              'forward pass) took %.0f%% longer than the other workers\' '
              'median over the last %.0f s of training (steps %d to %d); '
              'every step waits for it', worker, 100 * excess,
              sum(s for s, _, _ in self._loops), since, step)
      episode['to_step'] = step
      episode['over_median'] = round(max(episode['over_median'], excess), 3)
    for worker in sorted(set(self._slow) - set(slow)):
      del self._slow[worker]
      if self._log:
        logging.info('worker %d is no longer slow (step %d)', worker, step)

  def summary(self) -> Dict[str, Optional[List]]:
    """Each worker's own time per step over this attempt, by worker index,
    and each stretch a worker was slow: its steps and its largest excess
    over the others' median."""
    return {'own_step_seconds': (None if self._own is None else
                                 [round(float(t), 5)
                                  for t in self._own / self._steps]),
            'slow_workers': list(self._episodes)}
