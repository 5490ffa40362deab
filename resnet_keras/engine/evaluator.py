"""Evaluation of a classifier: loss, top-1 and top-5 over every example.

`Evaluator` is an orbit StandardEvaluator. Its metrics are weighted by
example counts, summed over Horovod workers at the end (tf.distribute's
already span every replica), so every validation example counts once
whatever the layout. With --eval_flip it averages each image's and its
mirror's logits (`flip_average`); with --ema_decay it scores the weight
average, swapped into the model for the evaluation and out after. Training
(run.py) and the tools that score a run's checkpoints (validate, average)
evaluate with it, so they report the same numbers.
"""

from typing import Optional

import orbit
import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.engine.objective import cross_entropy


def flip_average(probs, mirrored_probs):
  """The softmax of the mean of two views' logits, from their softmax
  outputs: log-probabilities are the logits less a per-image constant,
  which the softmax ignores. (Test-time flip augmentation.)"""
  tiny = tf.constant(1e-30, probs.dtype)  # log(0) is -inf: keep it finite.
  return tf.nn.softmax((tf.math.log(tf.maximum(probs, tiny)) +
                        tf.math.log(tf.maximum(mirrored_probs, tiny))) / 2)


class Evaluator(orbit.StandardEvaluator):
  """Count-weighted evaluation of `model` on `eval_dataset`."""

  def __init__(self, *, model: tf_keras.Model, eval_dataset,
               num_classes: int, backend: distribution.Backend,
               eval_flip: bool = False,
               ema: Optional[
                   ema_lib.EMA] = None,
               use_tf_function: bool = True):
    self.model = model
    self.num_classes = num_classes
    self.backend = backend
    self.strategy = backend.strategy
    self.eval_flip = eval_flip
    self.ema = ema
    with self.strategy.scope():
      self.eval_loss = tf_keras.metrics.Mean('eval_loss')
      self.eval_accuracy = tf_keras.metrics.SparseCategoricalAccuracy(
          'eval_accuracy')
      self.eval_top5 = tf_keras.metrics.SparseTopKCategoricalAccuracy(
          k=min(5, num_classes), name='eval_top5_accuracy')
    super().__init__(
        eval_dataset,
        options=orbit.StandardEvaluatorOptions(
            use_tf_function=use_tf_function, use_tf_while_loop=False))

  def evaluate(self, num_steps):
    """orbit's evaluation, of the weight average when there is one."""
    with ema_lib.in_model(self.ema):
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

  # orbit traces this with AutoGraph, which nothing in it needs (see
  # Trainer.create_train_loop_fn): it would convert every layer call.
  @tf.autograph.experimental.do_not_convert
  def eval_step(self, iterator):

    def step_fn(inputs):
      images, labels = inputs
      # A replica's share of the last, partial batch can be empty, and
      # TensorFlow 2.20's oneDNN Conv2D returns an empty batch unchanged (its
      # input's shape, not the convolution's), which the next layer rejects.
      probs = tf.cond(tf.shape(images)[0] > 0,
                      lambda: self.predict(images),
                      lambda: tf.zeros([0, self.num_classes]))
      self.eval_loss.update_state(
          cross_entropy(labels, probs, self.num_classes))
      self.eval_accuracy.update_state(labels, probs)
      self.eval_top5.update_state(labels, probs)

    self.strategy.run(step_fn, args=(next(iterator),))
    # The step's collectives (multi_worker_mirrored) answered: the stuck
    # worker watchdog's beat (resnet_keras/training/watchdog.py).
    tf.py_function(self.backend.progress.beat, [], [])

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
