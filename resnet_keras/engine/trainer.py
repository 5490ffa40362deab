"""The training loop orbit runs: steps of the objective, recorded.

`Trainer` is an orbit StandardTrainer composed of the parts of a step: the
`Objective` (objective.py: the loss and its gradients), the `StepRecord`
(step_record.py: what each step leaves for the host), the weight average
(ema.py: updated after each optimizer step) and, from the
guards, a stop poll checked before each step (guards.stop_poll) and the
finite check of the weights at each loop's end. A loop's output is what
orbit writes to TensorBoard plus the loop's LoopRecord, under LOOP_RECORD,
for the train actions (metrics.StepLogger, guards.LoopGuard).
When things happen (loops, evaluations, checkpoints) is decided in run.py;
evaluation is evaluator.py's.
"""

from typing import Callable, Dict, Optional

import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.engine.objective import Objective
from resnet_keras.engine.metrics import LOOP_RECORD
from resnet_keras.engine.step_record import StepRecord


class Trainer(orbit.StandardTrainer):
  """Trains `objective`'s model, `steps_per_loop` steps per host call."""

  def __init__(self, *, objective: Objective, step_record: StepRecord,
               train_dataset, global_batch_size: int,
               backend: distribution.Backend,
               weights_finite: Callable[[], bool],
               ema: Optional[
                   ema_lib.EMA] = None,
               stop_poll: Optional[Callable[[], tf.Tensor]] = None,
               use_tf_function: bool = True, use_tf_while_loop: bool = True):
    """`global_batch_size`: examples per optimizer step over the job (more
    than the objective's program batch under Horovod). `stop_poll` (a
    graph predicate, guards.stop_poll) is checked before each step; when it
    is true, the loop ends there on every worker."""
    self.objective = objective
    self.step_record = step_record
    self.model = objective.model
    self.optimizer = objective.optimizer
    self.strategy = backend.strategy
    self.global_step = self.optimizer.iterations
    self.global_batch_size = global_batch_size
    self.backend = backend
    self.ema = ema
    self._weights_finite = weights_finite
    self._stop_poll = stop_poll
    # What each worker updates from its own batches alone: batch-norm moving
    # statistics (per-replica, read as their mean under tf.distribute) and
    # their weight averages.
    self._worker_local = [
        v for v in self.model.variables
        if v.synchronization == tf.VariableSynchronization.ON_READ]
    if ema is not None:
      self._worker_local += ema.averages_of(self._worker_local)
    super().__init__(
        train_dataset,
        options=orbit.StandardTrainerOptions(
            use_tf_function=use_tf_function,
            use_tf_while_loop=use_tf_while_loop))

  def create_train_loop_fn(self):
    """orbit's loop, plus the stop poll before each step, in graph ops.

    Traced without AutoGraph, which would otherwise convert this loop and
    every function and layer call under it (23 of ours, ~1 s of CPU in each
    process that trains). Nothing below needs it: its Python branches are on
    Python values, and the loop's are the tf.while_loop and tf.cond here.
    """
    options = self._train_options
    if not options.use_tf_while_loop:
      step_fn = (tf.function(self.train_step, autograph=False)
                 if options.use_tf_function else self.train_step)

      def python_loop(iterator, num_steps):
        for _ in range(int(num_steps)):
          if self._stop_poll is not None and self._stop_poll():
            self.step_record.mark_stopped()
            break
          step_fn(iterator)

      return python_loop

    def loop_fn(iterator, num_steps):

      def step(i, stopped):
        # Ops named as orbit's loop names them: without the "while/" prefix.
        with tf.name_scope(''):
          self.train_step(iterator)
        return i + 1, stopped

      def stop(i, unused_stopped):
        self.step_record.mark_stopped()
        return i, tf.constant(True)

      def poll_then_step(i, stopped):
        if self._stop_poll is None:
          return step(i, stopped)
        return tf.cond(self._stop_poll(), lambda: stop(i, stopped),
                       lambda: step(i, stopped))

      tf.while_loop(
          lambda i, stopped: tf.logical_and(i < num_steps,
                                            tf.logical_not(stopped)),
          poll_then_step, (tf.constant(0, num_steps.dtype),
                           tf.constant(False)))

    return tf.function(loop_fn, autograph=False)

  def train_loop_begin(self):
    self.step_record.begin()

  def train_step(self, iterator):

    def step_fn(inputs):
      images, labels = inputs
      grads, loss, correct, own_done = self.objective.gradients(images,
                                                                labels)
      self.optimizer.apply_gradients(
          zip(grads, self.model.trainable_variables))
      return loss, correct, own_done

    position = self.step_record.position()
    # After the stop poll's collective, before the input: this worker's
    # own work begins (automatic control dependencies keep the order).
    began = tf.timestamp()
    inputs = self.step_record.next_input(iterator)
    loss, correct, own_done = self.strategy.run(step_fn, args=(inputs,))
    # This worker's replicas' own work, not a collective over the workers.
    self.step_record.add_own_time(tf.reduce_max(
        self.strategy.experimental_local_results(own_done)) - began)
    if self.ema is not None:
      self.ema.update(self.global_step)
    reduce = lambda t: self.strategy.reduce('SUM', t, axis=None)
    self.step_record.write(position, reduce(loss), reduce(correct),
                           self.optimizer.loss_scale
                           if self.objective.uses_loss_scale else None)

  def train_loop_end(self) -> Dict:
    # Horovod: every loop ends with each worker holding the chief's
    # statistics, the ones its checkpoints and exports hold; so evaluations
    # score one model, and a run resumed from a checkpoint (which hands
    # every worker the chief's) goes on exactly as an uninterrupted one.
    self.backend.sync_from_chief(self._worker_local)
    loop = self.step_record.read(
        self.backend.sum_over_workers, self.global_batch_size,
        self.objective.program_batch_size, self._weights_finite)
    # Every worker calls it, steps or none: a collective.
    loop.own_step_seconds = self.backend.each_worker(
        loop.own_seconds / max(1, len(loop.losses)))
    output = {LOOP_RECORD: loop}
    num_steps = len(loop.losses)
    if num_steps:  # A stop before the loop's first step: no summaries.
      output.update({
          'train_loss': float(np.mean(loop.losses)),
          'train_accuracy': float(np.mean(loop.accuracies)),
          'learning_rate': float(self.current_learning_rate()),
          'examples_per_second':
              num_steps * self.global_batch_size / loop.seconds,
      })
    return output

  def current_learning_rate(self):
    lr = self.optimizer.learning_rate
    if isinstance(lr, tf_keras.optimizers.schedules.LearningRateSchedule):
      return lr(self.global_step).numpy()
    return tf_keras.backend.get_value(lr)


class ScalarSummaries(orbit.utils.SummaryManager):
  """orbit's TensorBoard summaries of a loop's scalars: its LoopRecord is
  for the train actions, not a summary."""

  def write_summaries(self, summary_dict):
    super().write_summaries({k: v for k, v in summary_dict.items()
                             if k != LOOP_RECORD})
