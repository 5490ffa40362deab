"""What each step of a training loop leaves for the host to read.

orbit runs `steps_per_loop` steps inside one `tf.function` (a `tf.range`
loop) per host call. So the host still sees every step, each step writes its
loss and its count of correct predictions (and fp16's loss scale) into
small on-device buffers, at the step's position in the loop; `read` copies
them out once per loop into a `LoopRecord`, which is what the loop's train
actions (log lines, guards) get. Each step also adds the time it waited for
its batch to a counter, so the logs can say when training is input-bound,
and marks while it waits, so a watchdog can tell a stalled input.
"""

import time
from typing import Callable

import tensorflow as tf

from resnet_keras.engine.metrics import LoopRecord


class StepRecord:
  """The device buffers of one loop's steps, and their readout."""

  def __init__(self, global_step: tf.Variable, max_steps_per_loop: int,
               with_loss_scales: bool = False):
    self._global_step = global_step
    self._with_loss_scales = with_loss_scales
    # Host-side bookkeeping: outside any strategy scope, never checkpointed.
    with tf.init_scope():
      self._loop_start = tf.Variable(0, dtype=tf.int64, trainable=False)
      self._losses = tf.Variable(tf.zeros([max_steps_per_loop]),
                                 trainable=False)
      self._correct = tf.Variable(tf.zeros([max_steps_per_loop]),
                                  trainable=False)
      self._loss_scales = tf.Variable(tf.zeros([max_steps_per_loop]),
                                      trainable=False)
      self._input_wait = tf.Variable(0.0, dtype=tf.float64, trainable=False)
      # When the current step began waiting for its input; 0: not waiting.
      self._waiting_since = tf.Variable(0.0, dtype=tf.float64,
                                        trainable=False)
      self._stopped_early = tf.Variable(False, trainable=False)
      # Seconds of the loop's steps this worker worked on its own (input,
      # forward pass: objective.Objective.gradients), waiting on no other.
      self._own_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    self._started_at = 0.0

  # -- Host, before the loop -------------------------------------------------

  def begin(self) -> None:
    self._loop_start.assign(self._global_step)
    self._input_wait.assign(0.0)
    self._own_seconds.assign(0.0)
    self._stopped_early.assign(False)
    self._started_at = time.perf_counter()

  # -- In the loop's tf.function ---------------------------------------------

  def position(self):
    """This step's index in the loop; read before the step updates the
    weights (automatic control dependencies keep the order)."""
    return self._global_step - self._loop_start

  def next_input(self, iterator):
    """The step's batch, timing how long it waited for it."""
    # The step's previous updates come first (automatic control dependencies
    # order stateful ops), so this measures only time blocked on the input.
    waiting_since = tf.timestamp()
    with tf.control_dependencies([self._waiting_since.assign(waiting_since)]):
      inputs = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(inputs,
                                                 expand_composites=True)):
      self._input_wait.assign_add(tf.timestamp() - waiting_since)
      self._waiting_since.assign(0.0)
    return inputs

  def write(self, position, loss, correct, loss_scale=None) -> None:
    """Step `position`'s loss and correct count (summed over replicas)."""
    self._losses.scatter_nd_update([[position]], [loss])
    self._correct.scatter_nd_update([[position]], [correct])
    if loss_scale is not None:
      self._loss_scales.scatter_nd_update([[position]],
                                          [tf.cast(loss_scale, tf.float32)])

  def add_own_time(self, seconds) -> None:
    self._own_seconds.assign_add(seconds)

  def mark_stopped(self) -> None:
    self._stopped_early.assign(True)

  # -- Host ------------------------------------------------------------------

  def input_waiting_since(self) -> float:
    """The wall time (time.time()) since which training has been waiting for
    a batch; 0 while it is not (read from another thread: the watchdog)."""
    return float(self._waiting_since.numpy())

  def stopped_early(self) -> bool:
    """Whether a stop request ended the last loop before its last step."""
    return bool(self._stopped_early.numpy())

  def read(self, sum_over_workers: Callable, global_batch_size: int,
           program_batch_size: int,
           weights_finite: Callable[[], bool]) -> LoopRecord:
    """The loop just run, as every worker saw it: losses and accuracies
    over the global batch (`sum_over_workers` sums Horovod workers' values
    in one collective; tf.distribute's are already reduced), and whether
    the weights are finite after it."""
    first = int(self._loop_start.numpy())
    num_steps = int(self._global_step.numpy()) - first
    loss_sums, correct_sums = sum_over_workers(
        tf.stack([self._losses[:num_steps], self._correct[:num_steps]]),
        'loop_losses_and_correct')
    # Each program's loss is a mean over its own batch.
    losses = loss_sums / (global_batch_size // program_batch_size)
    return LoopRecord(
        first_step=first + 1, losses=losses,
        accuracies=correct_sums / global_batch_size,
        seconds=time.perf_counter() - self._started_at,
        input_wait_seconds=float(self._input_wait.numpy()),
        own_seconds=float(self._own_seconds.numpy()),
        weights_finite=weights_finite(), stopped_early=self.stopped_early(),
        loss_scales=(self._loss_scales[:num_steps].numpy()
                     if self._with_loss_scales else None))
