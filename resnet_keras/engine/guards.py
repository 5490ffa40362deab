"""What stops a run: preemption signals (before the next step), non-finite
losses or weights (after the loop).

`LoopGuard` is an orbit train action, so it runs on the host after every
loop of `steps_per_loop` steps, on the loop's record. A signal also ends the
loop early: Python runs signal handlers only when the main thread leaves the
loop's tf.function, so the C-level handler's wakeup byte
(`signal.set_wakeup_fd`) is what the loop polls before each step
(`stop_poll`: `stop_requested`, combined over workers); a minutes-long CPU
loop would otherwise outlast a scheduler's grace period. Every worker
reaches the same verdict at the same step: the loop combines its stop flag
over workers before each step, the signal flag and the weights check
(`finite_check`, run at the loop's end) are combined in one collective
after the loop, and the losses are already reduced over them, so no worker
is left waiting in a collective for one that stopped.

The guard stays installed through the export (`installed`), where no step
comes to stop at: there a stop signal ends the export at once
(`at_once`), and one that arrived during the last evaluation before it.
"""

import contextlib
import logging as std_logging
import os
import signal
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_keras.engine import distribution
from common import interrupts
from common.errors import NON_FINITE_EXIT_CODE, WARNING_SIGNAL, RunStopped
from resnet_keras.engine.metrics import LOOP_RECORD

# SIGTERM, Ctrl-C and a closed terminal (SIGHUP, whose default would end
# the run without a word, losing the steps since the last checkpoint): save
# and stop; the scheduler's warning: the same, and the launcher then has the
# job resumed elsewhere (common/errors.py).
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, WARNING_SIGNAL)


class _Stop:
  """What a stop signal's exceptions say of it."""

  signum: int

  @property
  def exit_code(self) -> int:
    # The shell's convention: 143 TERM, 130 INT, 129 HUP, 138 the warning
    # (USR1).
    return 128 + self.signum

  @property
  def hint(self) -> str:
    """What the user may want to know beyond "rerun" ('' or '; ...')."""
    if self.signum == signal.SIGHUP:
      return ('; SIGHUP is a closed terminal: nohup, tmux or screen keep a '
              'run going without one')
    return ''


class SignalReceived(_Stop, Exception):
  """A preemption signal arrived; run.py saves and then stops."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


class StopNow(_Stop, BaseException):
  """A stop signal where no step comes to stop at (the export), raised by
  the handler itself where Python next runs. A BaseException, as
  KeyboardInterrupt is: no `except Exception` on the way (TensorFlow's
  tracing has some) may swallow it."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def non_finite_step(losses: np.ndarray, first_step: int) -> Optional[int]:
  """Global step of the first non-finite loss in a loop, or None."""
  bad = np.flatnonzero(~np.isfinite(losses))
  return first_step + int(bad[0]) if bad.size else None


def non_finite_message(problem: str, last_checkpoint: Optional[str],
                       dtype: str) -> str:
  """`problem` (what went non-finite, and when), what was kept, and why."""
  kept = (f'the last checkpoint ({last_checkpoint}) is kept' if
          last_checkpoint else 'no checkpoint was written')
  causes = ['a learning rate too high for this batch (--base_learning_rate, '
            '--warmup_epochs)']
  if dtype == 'fp16':
    causes.append('fp16 overflow (use dynamic loss scaling: --loss_scale=0, '
                  'or --dtype=bf16)')
  causes.append('corrupt input data')
  return f'{problem}; stopped, {kept}. Likely causes: {"; ".join(causes)}'


def finite_check(variables) -> Callable[[], bool]:
  """Whether every one of `variables` is finite: one tf.function call
  (11 ms for ResNet-50 on 2 CPU cores), not an eager op per variable."""
  check = tf.function(
      lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                             for v in variables]), autograph=False)
  return lambda: bool(check())


def stop_poll(stop_requested: Callable[[], bool],
              backend: distribution.Backend) -> Callable[[], tf.Tensor]:
  """A predicate for inside the training loop's tf.function: whether
  `stop_requested` (host code) is true on any worker. A collective that
  every worker evaluates before each step; each poll tells the backend's
  `progress` that the job's collectives still move."""

  def asked() -> bool:
    backend.progress.beat()  # The last step's collectives answered.
    return stop_requested()

  def any_worker_asks():
    requested = tf.py_function(asked, [], tf.bool)
    return backend.count_workers(tf.reshape(requested, [1]),
                                 'stop_requested')[0] > 0

  return any_worker_asks


class LoopGuard:
  """Train action: stops on a non-finite loss or weight, or a preemption
  signal.

  The weights are checked too because a loss can stay finite over a
  non-finite weight: a dead unit's NaN does not reach it (e.g. a batch-norm
  moving variance, or a NaN that a bitwise ReLU turned into 0).
  """

  def __init__(self, any_worker: Callable[..., Tuple[bool, ...]],
               last_checkpoint: Callable[[], Optional[str]], dtype: str,
               stopped_early: Callable[[], bool]):
    """`stopped_early`: whether a stop request ended the loop that just ran
    (its StepRecord's), asked before the loop's record reaches the guard."""
    self._any_worker = any_worker
    self._last_checkpoint = last_checkpoint
    self._dtype = dtype
    self._received = set()  # The stop signals that arrived.
    self._previous = {}
    self._wakeup = None  # (read end, write end, the wakeup fd it replaced)
    self._orbit_filter = _ShortLoopWarning(stopped_early)
    self._at_once = False  # `at_once`: a signal raises StopNow.

  @contextlib.contextmanager
  def installed(self):
    """The handlers, from before training to the end of the export: a
    signal between the two is kept for the export (`at_once`), not left to
    the default action, which ends the process without a word."""
    self.install()
    try:
      yield self
    finally:
      self.uninstall()

  @contextlib.contextmanager
  def at_once(self):
    """A stop signal now raises StopNow, at once; one that arrived since
    the last loop (in the last evaluation) raises it here. A checkpoint
    is not written: the run's last one is, by then, and an export cut short
    is only a temporary directory (serving/saved_model.py), so a rerun
    writes it again."""
    self.stop_requested()
    if self._received:
      terminate = self._received - {WARNING_SIGNAL}
      raise StopNow(min(terminate) if terminate else WARNING_SIGNAL)
    self._at_once = True
    try:
      yield
    finally:
      self._at_once = False

  def install(self) -> None:
    for signum in _SIGNALS:
      # One ignored stays ignored: nohup's SIGHUP, a background job's
      # Ctrl-C (Python keeps that one ignored too).
      if signal.getsignal(signum) != signal.SIG_IGN:
        self._previous[signum] = signal.signal(signum, self._on_signal)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    self._wakeup = (read_end, write_end, signal.set_wakeup_fd(
        write_end, warn_on_full_buffer=False))
    logging.get_absl_logger().addFilter(self._orbit_filter)
    if interrupts.take_warning():
      logging.warning('received %s during start-up: stopping before the '
                      'first step', WARNING_SIGNAL.name)
      self._received.add(WARNING_SIGNAL)

  def uninstall(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}
    if self._wakeup:
      read_end, write_end, previous = self._wakeup
      signal.set_wakeup_fd(previous)
      os.close(read_end)
      os.close(write_end)
      self._wakeup = None
    logging.get_absl_logger().removeFilter(self._orbit_filter)

  def stop_requested(self) -> bool:
    """Whether a stop signal arrived; safe to call from any thread (the
    train loop polls it through tf.py_function before each step)."""
    if self._wakeup:
      try:
        received = os.read(self._wakeup[0], 64)
      except BlockingIOError:
        received = b''
      self._received.update(s for s in received if s in _SIGNALS)
    return bool(self._received)

  def _on_signal(self, signum, frame):
    del frame
    logging.warning('received %s: %s', signal.Signals(signum).name,
                    'stopping now' if self._at_once else
                    'stopping after the current step')
    self._received.add(signum)
    # A second signal acts as it would without us (e.g. a hard Ctrl-C); a
    # warning may come twice (to the step and through the launcher) and
    # must not end the save it asked for.
    if signum != WARNING_SIGNAL:
      signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
    if self._at_once:
      self._at_once = False  # One StopNow: the handlers on its way run.
      raise StopNow(signum)

  def __call__(self, output) -> None:
    loop = output[LOOP_RECORD]
    step = non_finite_step(loop.losses, loop.first_step)
    problem = None
    if step is not None:
      problem = (f'training loss is {loop.losses[step - loop.first_step]} at '
                 f'step {step}')
    else:
      # The losses are already reduced over workers; Horovod workers keep
      # their own batch-norm statistics, and a signal reaches one worker:
      # both verdicts are combined in one collective, so no worker stops
      # alone while the others wait in the next one.
      # Which signal, too: each worker's arrives at its own time, and all
      # must stop for the same one (their exit codes tell the launcher
      # whether to resume the job elsewhere).
      self.stop_requested()
      terminate = self._received - {WARNING_SIGNAL}
      weights_bad, terminated, warned = self._any_worker(
          not loop.weights_finite, bool(terminate),
          WARNING_SIGNAL in self._received)
      if weights_bad:
        last_step = loop.first_step + len(loop.losses) - 1
        problem = (f'a weight or batch-norm statistic is non-finite after '
                   f'step {last_step} (the losses were finite)')
      elif terminated or warned or loop.stopped_early:
        raise SignalReceived(
            min(terminate) if terminate else
            WARNING_SIGNAL if warned and not terminated else signal.SIGTERM)
    if problem:
      raise RunStopped(non_finite_message(problem, self._last_checkpoint(),
                                          self._dtype),
                       NON_FINITE_EXIT_CODE)


class _ShortLoopWarning(std_logging.Filter):
  """Drops orbit's warning that a loop ran fewer steps than asked when a
  stop ended it: that is the stop, and the guard says so itself."""

  def __init__(self, stopped_early: Callable[[], bool]):
    super().__init__()
    self._stopped_early = stopped_early

  def filter(self, record) -> bool:
    # The message first: the flag is a variable, readable only eagerly, and
    # the filter sees every record, also those logged while a tf.function
    # traces (a signal's own warning can land there).
    return not ('did not update `global_step`' in record.getMessage() and
                self._stopped_early())
