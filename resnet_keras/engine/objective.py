"""What a training step minimises, and its gradients.

The forward pass of the training model; the loss (`--loss`) as this
replica's share of the mean over the batch its strategy trains: the
cross-entropy of the softmax (with label smoothing), or a sigmoid
cross-entropy per class on the logits (`binary_cross_entropy`, through the
logits twin of the training model, network.build_logits_model), summed over
the classes; weight decay on the path the optimizer's configuration chose
(optimizers.weight_decay_path: per-layer regularisers, one L2 term, or
inside LARS, AdamW or LAMB, where it adds nothing here); fp16's loss
scaling applied to the loss and taken out of the gradients. Labels are
class indices, or per-class targets [batch, classes] (mixed batches, their
label smoothing already inside). With gradient accumulation the batch is
split into K micro-batches whose float32 gradients are summed in a
`tf.while_loop`, and weight decay is added once: the all-reduce (Horovod's
explicit one here, tf.distribute's inside `apply_gradients`) then runs once
per optimizer step, not per micro-batch. --clip_grad_norm clips after that,
inside the optimizer (optimizers.py).
"""

from typing import Any, Optional, Tuple

import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.model import layers
from resnet_keras.optimization import optimizers as optimizers_lib
from resnet_keras.data import augment


def _is_soft(labels) -> bool:
  """Per-class float targets [batch, classes] rather than class indices."""
  return labels.dtype.is_floating and labels.shape.rank == 2


def cross_entropy(labels, probs, num_classes: int, label_smoothing: float = 0.0):
  """Per-example cross-entropy of softmax outputs `probs`: against class
  indices (smoothed here), or -sum(targets * log probs) against soft
  targets, whose smoothing is already in them."""
  if _is_soft(labels):
    return tf_keras.losses.categorical_crossentropy(labels, probs)
  if label_smoothing:
    one_hot = tf.one_hot(labels, num_classes)
    return tf_keras.losses.categorical_crossentropy(
        one_hot, probs, label_smoothing=label_smoothing)
  return tf_keras.losses.sparse_categorical_crossentropy(labels, probs)


def bce_targets(labels, num_classes: int, label_smoothing: float = 0.0,
                threshold: float = 0.0) -> tf.Tensor:
  """Per-class float32 targets of the sigmoid cross-entropy, as timm's
  BinaryCrossEntropy makes them: class indices become one-hot with label
  smoothing (1 - s + s/classes and s/classes), soft targets stay as they
  are; then, if `threshold` > 0, each is 1 above it and 0 otherwise."""
  if _is_soft(labels):
    targets = tf.cast(labels, tf.float32)
  else:
    targets = augment.smoothed_one_hot(labels, num_classes, label_smoothing)
  if threshold:
    targets = tf.cast(targets > threshold, tf.float32)
  return targets


def binary_cross_entropy(labels, logits, num_classes: int,
                         label_smoothing: float = 0.0,
                         threshold: float = 0.0) -> tf.Tensor:
  """Per-example sigmoid cross-entropy of `logits`, summed over the classes
  (timm's sum_classes): each logit's gradient is sigmoid(z) - target, of the
  softmax cross-entropy's scale (p - target), so SGD keeps its learning
  rates; a mean over the classes would divide them by the class count."""
  targets = bce_targets(labels, num_classes, label_smoothing, threshold)
  return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=targets, logits=tf.cast(logits, tf.float32)), axis=-1)


def count_correct(labels, outputs) -> tf.Tensor:
  """Examples whose top output (probabilities or logits: the same class) is
  their label, or their soft target's top class."""
  if _is_soft(labels):
    labels = tf.argmax(labels, axis=-1)
  predictions = tf.argmax(outputs, axis=-1, output_type=labels.dtype)
  return tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32))


def _time_after(tensors) -> tf.Tensor:
  """The time (tf.timestamp) once `tensors` are computed."""
  with tf.control_dependencies(tf.nest.flatten(tensors)):
    return tf.timestamp()


def _micro_batches(tensor, k: int):
  """`tensor` split along the batch into [k, batch / k, ...]."""
  return tf.reshape(tensor, [k, -1] + tensor.shape[1:].as_list())


def pass_draws(run_seed: Optional[int], step, passes_per_step: int,
               micro_batch, backend: distribution.Backend):
  """A forward and backward pass's random draws (layers.drop_path_seed):
  from (run seed, step, micro-batch, replica), so that a resumed run draws
  what the uninterrupted one did; unseeded where `run_seed` is None."""
  if run_seed is None:
    return layers.drop_path_seed(None)
  pass_index = (tf.cast(step, tf.int64) * passes_per_step +
                tf.cast(micro_batch, tf.int64))
  seed = tf.stack([tf.constant(run_seed, tf.int64), pass_index])
  # Horovod workers each drive one replica 0; tf.distribute numbers its
  # replicas across workers.
  worker = backend.worker_index if backend.hvd else 0
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  fold_in = tf.random.experimental.stateless_fold_in
  return layers.drop_path_seed(
      fold_in(fold_in(seed, worker), tf.cast(replica, tf.int64)))


class Objective:
  """The loss of a classifier's training step, and its gradients."""

  def __init__(self, *, model: tf_keras.Model, optimizer: Any,
               backend: distribution.Backend, num_classes: int,
               program_batch_size: int, label_smoothing: float = 0.0,
               weight_decay: float = 0.0, weight_decay_path: str = 'none',
               num_accumulation_steps: int = 1, loss: str = 'softmax',
               bce_target_threshold: float = 0.0,
               logits_model: Optional[tf_keras.Model] = None,
               drop_path_seed: Optional[int] = None):
    """`program_batch_size`: the batch this program's replicas train per
    step together (plan.TrainingPlan: the global batch, or one Horovod
    worker's), which each replica's loss is a share of the mean over.
    `loss` 'bce' trains on `logits_model`'s outputs: `model` up to its
    logits, sharing its variables (network.build_logits_model).
    `drop_path_seed`: the run's seed, when the model has drop path: each
    forward pass draws from (seed, step, micro-batch, replica), so a
    resumed run drops what the uninterrupted one did (None: unseeded)."""
    if loss == 'bce' and logits_model is None:
      raise ValueError("loss 'bce' needs the model's logits: pass "
                       'logits_model (network.build_logits_model)')
    self.model = model
    self.optimizer = optimizer
    self.backend = backend
    self.num_classes = num_classes
    self.program_batch_size = program_batch_size
    self.label_smoothing = label_smoothing
    self.weight_decay = weight_decay
    self.weight_decay_path = weight_decay_path
    self.num_accumulation_steps = num_accumulation_steps
    self.loss = loss
    self.bce_target_threshold = bce_target_threshold
    self.logits_model = logits_model
    self.drop_path_seed = drop_path_seed
    self.uses_loss_scale = isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

  def gradients(self, images, labels
                ) -> Tuple[list, tf.Tensor, tf.Tensor, tf.Tensor]:
    """(gradients ready to apply, this replica's share of the loss, its
    count of correct predictions, when its own work was done), in a replica
    context. Its own work is what it computes before the step's first
    collective waits on the others: the forward pass (the all-reduce of a
    Horovod tape may start during the backward pass), or with accumulation
    every micro-batch's forward and backward pass. Its time tells a slow
    worker from the others, who wait for it (slow_workers.py)."""
    if self.num_accumulation_steps == 1:
      grads, loss, correct, own_done = self._gradients(images, labels)
    else:
      grads, loss, correct, own_done = self._accumulated_gradients(images,
                                                                   labels)
    if self.uses_loss_scale:
      grads = self.optimizer.get_unscaled_gradients(grads)
    return grads, loss, correct, own_done

  def weight_decay_loss(self):
    """This replica's share of the weight-decay term (0 where the
    optimizer decays: LARS, AdamW, LAMB)."""
    if self.weight_decay_path == 'regularizers':
      return tf.add_n(self.model.losses)
    if self.weight_decay_path == 'single_l2_loss_op':
      return optimizers_lib.single_l2_loss(self.model.trainable_variables,
                                           self.weight_decay)
    return tf.constant(0.0)

  def _forward(self, images, labels):
    """The loss (a share of the program batch's mean) and the count of
    correct predictions."""
    if self.loss == 'bce':
      outputs = self.logits_model(images, training=True)
      per_example = binary_cross_entropy(
          labels, outputs, self.num_classes, self.label_smoothing,
          self.bce_target_threshold)
    else:
      outputs = self.model(images, training=True)
      per_example = cross_entropy(labels, outputs, self.num_classes,
                                  self.label_smoothing)
    loss = tf.nn.compute_average_loss(
        per_example, global_batch_size=self.program_batch_size)
    return loss, count_correct(labels, outputs)

  def _draws(self, micro_batch=0):
    return pass_draws(self.drop_path_seed, self.optimizer.iterations,
                      self.num_accumulation_steps, micro_batch, self.backend)

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
    # The draws hold over the backward pass too: recomputed stages
    # (--enable_recompute) drop the same branches again.
    with self._draws():
      with tf.GradientTape() as tape:
        loss, correct = self._forward(images, labels)
        total = self._scaled(loss + self._decay_share())
      # Made before the tape's all-reduce, so that automatic control
      # dependencies, which order stateful ops as written, do not put it
      # after.
      own_done = _time_after(total)
      grads = self.backend.gradient_tape(tape).gradient(total, variables)
    return grads, loss, correct, own_done

  def _accumulated_gradients(self, images, labels):
    """Sums the gradients of K micro-batches in float32, then adds weight
    decay once; the losses already divide by the whole batch, so the sum
    is the gradient of the whole batch's mean loss."""
    k = self.num_accumulation_steps
    variables = self.model.trainable_variables
    micro_images = _micro_batches(images, k)
    micro_labels = _micro_batches(labels, k)

    def micro_step(i, sums, loss, correct):
      with self._draws(i):
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
    # LARS, AdamW and LAMB decay inside the optimizer; biases and batch
    # norm are never decayed (their decay gradient is None): no work for
    # either.
    if self.weight_decay_path in ('regularizers', 'single_l2_loss_op'):
      with tf.GradientTape() as tape:
        decay = self._scaled(self._decay_share())
      grads = [g if d is None else g + d
               for g, d in zip(grads, tape.gradient(decay, variables))]
    own_done = _time_after(grads)
    return self.backend.allreduce_gradients(grads), loss, correct, own_done
