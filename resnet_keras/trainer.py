"""What one training or evaluation step computes (orbit Trainer/Evaluator).

orbit runs `train_step` `steps_per_loop` times inside one `tf.function`
(a `tf.range` loop) per host call. So the host still sees every step, each
step writes its loss and its count of correct predictions into a small
on-device buffer indexed by the step's position in the loop; `train_loop_end`
reads the buffer once and keeps the per-step values in `last_loop`.
Each step also adds the time it waited for its batch to a counter, so the
logs can say when training is input-bound. Before each step the loop asks
the host whether to stop (a signal arrived: guards.LoopGuard), combined over
workers, and ends early if so.
With gradient accumulation a step splits its batch into K micro-batches,
sums their float32 gradients in a `tf.while_loop` and applies them once: the
all-reduce (tf.distribute's in `apply_gradients`, Horovod's explicit one)
runs once per optimizer step, not per micro-batch.
With --ema_decay each step also updates the weight average
(weight_average.py), and evaluation scores the average, swapped into the
model for it and out after.
When things happen (loops, evals, checkpoints) is decided in run.py.
"""

import dataclasses
import time
from typing import Callable, Optional

import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from common import distribution
from resnet_keras import optimizers as optimizers_lib
from resnet_keras import weight_average as weight_average_lib


@dataclasses.dataclass
class LoopRecord:
  """Host-side copy of one training loop's per-step results."""
  first_step: int  # global step after the first step of the loop
  losses: np.ndarray
  accuracies: np.ndarray
  seconds: float
  input_wait_seconds: float = 0.0  # spent blocked on the input iterator
  weights_finite: bool = True  # every model variable, at the loop's end
  stopped_early: bool = False  # a stop request ended it before its last step
  # fp16's dynamic loss scale after each step (halved on a step whose
  # gradients overflowed, which was skipped); None without loss scaling.
  loss_scales: Optional[np.ndarray] = None


def flip_average(probs, mirrored_probs):
  """The softmax of the mean of two views' logits, from their softmax
  outputs: log-probabilities are the logits less a per-image constant,
  which the softmax ignores. (Test-time flip augmentation.)"""
  tiny = tf.constant(1e-30, probs.dtype)  # log(0) is -inf: keep it finite.
  return tf.nn.softmax((tf.math.log(tf.maximum(probs, tiny)) +
                        tf.math.log(tf.maximum(mirrored_probs, tiny))) / 2)


class ResnetTrainer(orbit.StandardTrainer, orbit.StandardEvaluator):
  """Cross-entropy training of a classifier, and count-weighted evaluation."""

  def __init__(self, *, strategy: tf.distribute.Strategy,
               model: tf_keras.Model, optimizer, train_dataset, eval_dataset,
               program_batch_size: int, num_classes: int,
               max_steps_per_loop: int, global_batch_size: Optional[int] = None,
               label_smoothing: float = 0.0, weight_decay: float = 0.0,
               weight_decay_path: str = 'none', use_tf_function: bool = True,
               use_tf_while_loop: bool = True, num_accumulation_steps: int = 1,
               eval_flip: bool = False,
               weight_average: Optional[
                   weight_average_lib.WeightAverage] = None,
               backend: Optional[distribution.Backend] = None,
               stop_requested: Optional[Callable[[], bool]] = None):
    """`program_batch_size` is the batch of `strategy`'s replicas together,
    `global_batch_size` the job's (more under Horovod, where each worker has
    its own program; default: the same). Each replica's share is split into
    `num_accumulation_steps` micro-batches (see config.TrainingPlan).
    `stop_requested` (host code, any thread) is polled before each step;
    when it is true on any worker, every worker ends the loop there.
    `eval_flip`: evaluation averages each image's and its mirror's logits
    (flip_average). `weight_average`: updated after each optimizer step, and
    what evaluation scores (swapped into the model for it)."""
    self.strategy = strategy
    self.backend = backend or distribution.Backend(strategy)
    self.model = model
    self.optimizer = optimizer
    self.global_step = optimizer.iterations
    self.program_batch_size = program_batch_size
    self.global_batch_size = global_batch_size or program_batch_size
    self.num_classes = num_classes
    self.label_smoothing = label_smoothing
    self.weight_decay = weight_decay
    self.weight_decay_path = weight_decay_path
    self.num_accumulation_steps = num_accumulation_steps
    self.eval_flip = eval_flip
    self.weight_average = weight_average
    self._stop_requested = stop_requested
    self.uses_loss_scale = isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    self.last_loop: Optional[LoopRecord] = None
    # What each worker updates from its own batches alone: batch-norm moving
    # statistics (per-replica, read as their mean under tf.distribute) and
    # their weight averages.
    self._worker_local = [
        v for v in model.variables
        if v.synchronization == tf.VariableSynchronization.ON_READ]
    if weight_average is not None:
      self._worker_local += weight_average.averages_of(self._worker_local)
    # One tf.function call per loop (11 ms for ResNet-50 on 2 CPU cores), not
    # an eager op per variable.
    def weights_finite():
      return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                            for v in model.variables])
    self._weights_finite = tf.function(weights_finite, autograph=False)

    # Host-side bookkeeping: outside the strategy scope, never checkpointed.
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
    with strategy.scope():
      self.eval_loss = tf_keras.metrics.Mean('eval_loss')
      self.eval_accuracy = tf_keras.metrics.SparseCategoricalAccuracy(
          'eval_accuracy')
      self.eval_top5 = tf_keras.metrics.SparseTopKCategoricalAccuracy(
          k=min(5, num_classes), name='eval_top5_accuracy')

    orbit.StandardTrainer.__init__(
        self, train_dataset,
        options=orbit.StandardTrainerOptions(
            use_tf_function=use_tf_function,
            use_tf_while_loop=use_tf_while_loop))
    orbit.StandardEvaluator.__init__(
        self, eval_dataset,
        options=orbit.StandardEvaluatorOptions(
            use_tf_function=use_tf_function, use_tf_while_loop=False))
    self._loop_started_at = 0.0

  # -- Loss ------------------------------------------------------------------

  def per_example_loss(self, labels, probs, label_smoothing):
    if label_smoothing:
      one_hot = tf.one_hot(labels, self.num_classes)
      return tf_keras.losses.categorical_crossentropy(
          one_hot, probs, label_smoothing=label_smoothing)
    return tf_keras.losses.sparse_categorical_crossentropy(labels, probs)

  def weight_decay_loss(self):
    """This replica's share of the weight-decay term (0 on the LARS path)."""
    if self.weight_decay_path == 'regularizers':
      return tf.add_n(self.model.losses)
    if self.weight_decay_path == 'single_l2_loss_op':
      return optimizers_lib.single_l2_loss(self.model.trainable_variables,
                                           self.weight_decay)
    return tf.constant(0.0)

  # -- Training --------------------------------------------------------------

  def create_train_loop_fn(self):
    """orbit's loop, plus a stop check before each step."""
    if self._stop_requested is None:
      return super().create_train_loop_fn()
    options = self._train_options
    step_fn = self.train_step
    if options.use_tf_function and not options.use_tf_while_loop:
      step_fn = tf.function(step_fn)

    def loop_fn(iterator, num_steps):
      for _ in tf.range(num_steps):
        if self._stop_on_any_worker():
          self._stopped_early.assign(True)
          break
        step_fn(iterator)

    return tf.function(loop_fn) if options.use_tf_while_loop else loop_fn

  def _stop_on_any_worker(self):
    requested = tf.py_function(self._stop_requested, [], tf.bool)
    return self.backend.count_workers(
        tf.reshape(requested, [1]), 'stop_requested')[0] > 0

  def train_loop_begin(self):
    self._loop_start.assign(self.global_step)
    self._input_wait.assign(0.0)
    self._stopped_early.assign(False)
    self._loop_started_at = time.perf_counter()

  def train_step(self, iterator):

    def step_fn(inputs):
      images, labels = inputs
      if self.num_accumulation_steps == 1:
        grads, cross_entropy, correct = self._gradients(images, labels)
      else:
        grads, cross_entropy, correct = self._accumulated_gradients(
            images, labels)
      if self.uses_loss_scale:
        grads = self.optimizer.get_unscaled_gradients(grads)
      self.optimizer.apply_gradients(
          zip(grads, self.model.trainable_variables))
      return cross_entropy, correct

    index = self.global_step - self._loop_start
    # The step's previous updates come first (automatic control dependencies
    # order stateful ops), so this measures only time blocked on the input.
    waiting_since = tf.timestamp()
    with tf.control_dependencies([self._waiting_since.assign(waiting_since)]):
      inputs = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(inputs,
                                                 expand_composites=True)):
      self._input_wait.assign_add(tf.timestamp() - waiting_since)
      self._waiting_since.assign(0.0)
    cross_entropy, correct = self.strategy.run(step_fn, args=(inputs,))
    if self.weight_average is not None:
      self.weight_average.update(self.global_step)
    reduce = lambda t: self.strategy.reduce('SUM', t, axis=None)
    self._losses.scatter_nd_update([[index]], [reduce(cross_entropy)])
    self._correct.scatter_nd_update([[index]], [reduce(correct)])
    if self.uses_loss_scale:
      self._loss_scales.scatter_nd_update(
          [[index]], [tf.cast(self.optimizer.loss_scale, tf.float32)])

  def _forward(self, images, labels):
    """Cross-entropy (a share of the global batch mean) and correct count."""
    probs = self.model(images, training=True)
    cross_entropy = tf.nn.compute_average_loss(
        self.per_example_loss(labels, probs, self.label_smoothing),
        global_batch_size=self.program_batch_size)
    predictions = tf.argmax(probs, axis=-1, output_type=labels.dtype)
    correct = tf.reduce_sum(tf.cast(tf.equal(predictions, labels),
                                    tf.float32))
    return cross_entropy, correct

  def _scaled(self, loss):
    return self.optimizer.get_scaled_loss(loss) if self.uses_loss_scale \
        else loss

  def _decay_share(self):
    # Gradients are summed over replicas, so each adds 1/n of the decay.
    return self.weight_decay_loss() / self.strategy.num_replicas_in_sync

  def _gradients(self, images, labels):
    """One tape over the whole batch: the loss plus weight decay."""
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      cross_entropy, correct = self._forward(images, labels)
      loss = self._scaled(cross_entropy + self._decay_share())
    grads = self.backend.gradient_tape(tape).gradient(loss, variables)
    return grads, cross_entropy, correct

  def _accumulated_gradients(self, images, labels):
    """Sums the gradients of K micro-batches in float32, then adds weight
    decay once; the losses already divide by the global batch, so the sum
    is the gradient of the whole batch's mean loss."""
    k = self.num_accumulation_steps
    variables = self.model.trainable_variables
    micro_images = tf.reshape(images, [k, -1] + images.shape[1:].as_list())
    micro_labels = tf.reshape(labels, [k, -1])

    def micro_step(i, sums, cross_entropy, correct):
      with tf.GradientTape() as tape:
        micro_cross_entropy, micro_correct = self._forward(
            micro_images[i], micro_labels[i])
        loss = self._scaled(micro_cross_entropy)
      grads = tape.gradient(loss, variables)
      sums = [s + tf.cast(g, tf.float32) for s, g in zip(sums, grads)]
      return (i + 1, sums, cross_entropy + micro_cross_entropy,
              correct + micro_correct)

    zeros = [tf.zeros(v.shape, tf.float32) for v in variables]
    _, sums, cross_entropy, correct = tf.while_loop(
        lambda i, *_: i < k, micro_step,
        (tf.constant(0), zeros, tf.constant(0.0), tf.constant(0.0)))
    grads = [tf.cast(s, v.dtype) for s, v in zip(sums, variables)]
    # LARS decays inside the optimizer; biases and batch norm are never
    # decayed (their decay gradient is None): no work for either.
    if self.weight_decay_path in ('regularizers', 'single_l2_loss_op'):
      with tf.GradientTape() as tape:
        decay = self._scaled(self._decay_share())
      grads = [g if d is None else g + d
               for g, d in zip(grads, tape.gradient(decay, variables))]
    return self.backend.allreduce_gradients(grads), cross_entropy, correct

  def input_waiting_since(self) -> float:
    """The wall time (time.time()) since which training has been waiting for
    a batch; 0 while it is not (read from another thread: the watchdog)."""
    return float(self._waiting_since.numpy())

  def train_loop_end(self):
    # Horovod: every loop ends with each worker holding the chief's
    # statistics, the ones its checkpoints and exports hold; so evaluations
    # score one model, and a run resumed from a checkpoint (which hands
    # every worker the chief's) goes on exactly as an uninterrupted one.
    self.backend.sync_from_chief(self._worker_local)
    num_steps = int(self.global_step.numpy() - self._loop_start.numpy())
    # One collective for both (Horovod; tf.distribute already reduced them).
    loss_sums, correct_sums = self.backend.sum_over_workers(
        tf.stack([self._losses[:num_steps], self._correct[:num_steps]]),
        'loop_losses_and_correct')
    # Each program's loss is a mean over its own batch.
    losses = loss_sums / (self.global_batch_size // self.program_batch_size)
    accuracies = correct_sums / self.global_batch_size
    seconds = time.perf_counter() - self._loop_started_at
    self.last_loop = LoopRecord(
        first_step=int(self._loop_start.numpy()) + 1, losses=losses,
        accuracies=accuracies, seconds=seconds,
        input_wait_seconds=float(self._input_wait.numpy()),
        weights_finite=bool(self._weights_finite()),
        stopped_early=bool(self._stopped_early.numpy()),
        loss_scales=(self._loss_scales[:num_steps].numpy()
                     if self.uses_loss_scale else None))
    if not num_steps:  # A stop before the loop's first step: no summaries.
      return {}
    return {
        'train_loss': float(np.mean(losses)),
        'train_accuracy': float(np.mean(accuracies)),
        'learning_rate': float(self.current_learning_rate()),
        'examples_per_second':
            num_steps * self.global_batch_size / seconds,
    }

  def current_learning_rate(self):
    lr = self.optimizer.learning_rate
    if isinstance(lr, tf_keras.optimizers.schedules.LearningRateSchedule):
      return lr(self.global_step).numpy()
    return tf_keras.backend.get_value(lr)

  # -- Evaluation ------------------------------------------------------------

  def evaluate(self, num_steps):
    """orbit's evaluation, of the weight average when there is one."""
    with weight_average_lib.in_model(self.weight_average):
      return super().evaluate(num_steps)

  def eval_begin(self):
    for metric in (self.eval_loss, self.eval_accuracy, self.eval_top5):
      metric.reset_states()

  def predict(self, images):
    """Evaluation's probabilities: of the images, or flip-averaged."""
    probs = self.model(images, training=False)
    if not self.eval_flip:
      return probs
    return flip_average(probs, self.model(tf.image.flip_left_right(images),
                                          training=False))

  def eval_step(self, iterator):

    def step_fn(inputs):
      images, labels = inputs
      # A replica's share of the last, partial batch can be empty, and
      # TensorFlow 2.20's oneDNN Conv2D returns an empty batch unchanged (its
      # input's shape, not the convolution's), which the next layer rejects.
      probs = tf.cond(tf.shape(images)[0] > 0,
                      lambda: self.predict(images),
                      lambda: tf.zeros([0, self.num_classes]))
      self.eval_loss.update_state(self.per_example_loss(labels, probs, 0.0))
      self.eval_accuracy.update_state(labels, probs)
      self.eval_top5.update_state(labels, probs)

    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    self.backend.sum_metrics_over_workers(
        (self.eval_loss, self.eval_accuracy, self.eval_top5))
    return {
        'eval_loss': float(self.eval_loss.result().numpy()),
        'eval_accuracy': float(self.eval_accuracy.result().numpy()),
        'eval_top5_accuracy': float(self.eval_top5.result().numpy()),
        # Mean's count is the number of per-example losses it averaged.
        'eval_examples': int(self.eval_loss.count.numpy()),
    }
