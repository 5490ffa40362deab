"""What a training step minimises, and its gradients.

The forward pass of the training model; the cross-entropy (with label
smoothing) as this replica's share of the mean over the batch its strategy
trains; weight decay on the path the optimizer's configuration chose
(optimizers.weight_decay_path: per-layer regularisers, one L2 term, or
inside LARS, where it adds nothing here); fp16's loss scaling applied to
the loss and taken out of the gradients. With gradient accumulation the
batch is split into K micro-batches whose float32 gradients are summed in a
`tf.while_loop`, and weight decay is added once: the all-reduce (Horovod's
explicit one here, tf.distribute's inside `apply_gradients`) then runs once
per optimizer step, not per micro-batch.
"""

from typing import Any, Tuple

import tensorflow as tf
import tf_keras

from common import distribution
from resnet_keras import optimizers as optimizers_lib


def cross_entropy(labels, probs, num_classes: int, label_smoothing: float = 0.0):
  """Per-example cross-entropy of softmax outputs `probs`."""
  if label_smoothing:
    one_hot = tf.one_hot(labels, num_classes)
    return tf_keras.losses.categorical_crossentropy(
        one_hot, probs, label_smoothing=label_smoothing)
  return tf_keras.losses.sparse_categorical_crossentropy(labels, probs)


class Objective:
  """The loss of a classifier's training step, and its gradients."""

  def __init__(self, *, model: tf_keras.Model, optimizer: Any,
               backend: distribution.Backend, num_classes: int,
               program_batch_size: int, label_smoothing: float = 0.0,
               weight_decay: float = 0.0, weight_decay_path: str = 'none',
               num_accumulation_steps: int = 1):
    """`program_batch_size`: the batch this program's replicas train per
    step together (plan.TrainingPlan: the global batch, or one Horovod
    worker's), which each replica's loss is a share of the mean over."""
    self.model = model
    self.optimizer = optimizer
    self.backend = backend
    self.num_classes = num_classes
    self.program_batch_size = program_batch_size
    self.label_smoothing = label_smoothing
    self.weight_decay = weight_decay
    self.weight_decay_path = weight_decay_path
    self.num_accumulation_steps = num_accumulation_steps
    self.uses_loss_scale = isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

  def gradients(self, images, labels) -> Tuple[list, tf.Tensor, tf.Tensor]:
    """(gradients ready to apply, this replica's cross-entropy share, its
    count of correct predictions), in a replica context."""
    if self.num_accumulation_steps == 1:
      grads, loss, correct = self._gradients(images, labels)
    else:
      grads, loss, correct = self._accumulated_gradients(images, labels)
    if self.uses_loss_scale:
      grads = self.optimizer.get_unscaled_gradients(grads)
    return grads, loss, correct

  def weight_decay_loss(self):
    """This replica's share of the weight-decay term (0 on the LARS path)."""
    if self.weight_decay_path == 'regularizers':
      return tf.add_n(self.model.losses)
    if self.weight_decay_path == 'single_l2_loss_op':
      return optimizers_lib.single_l2_loss(self.model.trainable_variables,
                                           self.weight_decay)
    return tf.constant(0.0)

  def _forward(self, images, labels):
    """Cross-entropy (a share of the program batch's mean) and the count
    of correct predictions."""
    probs = self.model(images, training=True)
    loss = tf.nn.compute_average_loss(
        cross_entropy(labels, probs, self.num_classes, self.label_smoothing),
        global_batch_size=self.program_batch_size)
    predictions = tf.argmax(probs, axis=-1, output_type=labels.dtype)
    correct = tf.reduce_sum(tf.cast(tf.equal(predictions, labels),
                                    tf.float32))
    return loss, correct

  def _scaled(self, loss):
    return self.optimizer.get_scaled_loss(loss) if self.uses_loss_scale \
        else loss

  def _decay_share(self):
    # Gradients are summed over replicas, so each adds 1/n of the decay.
    return (self.weight_decay_loss() /
            self.backend.strategy.num_replicas_in_sync)

  def _gradients(self, images, labels):
    """One tape over the whole batch: the loss plus weight decay."""
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      loss, correct = self._forward(images, labels)
      total = self._scaled(loss + self._decay_share())
    grads = self.backend.gradient_tape(tape).gradient(total, variables)
    return grads, loss, correct

  def _accumulated_gradients(self, images, labels):
    """Sums the gradients of K micro-batches in float32, then adds weight
    decay once; the losses already divide by the whole batch, so the sum
    is the gradient of the whole batch's mean loss."""
    k = self.num_accumulation_steps
    variables = self.model.trainable_variables
    micro_images = tf.reshape(images, [k, -1] + images.shape[1:].as_list())
    micro_labels = tf.reshape(labels, [k, -1])

    def micro_step(i, sums, loss, correct):
      with tf.GradientTape() as tape:
        micro_loss, micro_correct = self._forward(micro_images[i],
                                                  micro_labels[i])
        scaled = self._scaled(micro_loss)
      grads = tape.gradient(scaled, variables)
      sums = [s + tf.cast(g, tf.float32) for s, g in zip(sums, grads)]
      return i + 1, sums, loss + micro_loss, correct + micro_correct

    zeros = [tf.zeros(v.shape, tf.float32) for v in variables]
    _, sums, loss, correct = tf.while_loop(
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
    return self.backend.allreduce_gradients(grads), loss, correct
