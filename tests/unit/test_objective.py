"""The losses of a training step against hand-computed values: softmax
cross-entropy and per-class sigmoid cross-entropy (--loss=bce), on class
indices and on soft [batch, classes] targets; BCE's targets with label
smoothing and --bce_target_threshold; the count of correct predictions;
and the objective's gradients with soft targets and gradient accumulation."""

import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.engine import objective as objective_lib

# Two examples, three classes.
PROBS = tf.constant([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
SOFT = tf.constant([[0.8, 0.2, 0.0], [0.05, 0.05, 0.9]])
LOGITS = tf.constant([[2.0, 0.0, -1.0], [0.0, 1.0, -2.0]])
LABELS = tf.constant([0, 2])


def test_softmax_cross_entropy_of_soft_targets():
  # -sum(t * ln p): -(0.8 ln 0.7 + 0.2 ln 0.2) = 0.285340 + 0.321888;
  # -(0.05 ln 0.1 + 0.05 ln 0.3 + 0.9 ln 0.6) = 0.115129 + 0.060199 +
  # 0.459743. No smoothing on top of what the targets hold.
  losses = objective_lib.cross_entropy(SOFT, PROBS, 3, label_smoothing=0.3)
  np.testing.assert_allclose(losses.numpy(), [0.607228, 0.635071], atol=2e-6)


def test_softmax_cross_entropy_of_indices_is_the_smoothed_soft_one():
  np.testing.assert_allclose(
      objective_lib.cross_entropy(LABELS, PROBS, 3).numpy(),
      [-np.log(0.7), -np.log(0.6)], rtol=1e-6)
  # Smoothing 0.3 over 3 classes: targets 0.8 and 0.1.
  smoothed = tf.constant([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])
  np.testing.assert_allclose(
      objective_lib.cross_entropy(LABELS, PROBS, 3, 0.3).numpy(),
      objective_lib.cross_entropy(smoothed, PROBS, 3).numpy(), rtol=1e-6)


def test_bce_targets_smoothing_and_threshold():
  # timm: off = s / C = 0.1, on = 1 - s + off = 0.8.
  np.testing.assert_allclose(
      objective_lib.bce_targets(LABELS, 3, label_smoothing=0.3).numpy(),
      [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]], rtol=1e-6)
  np.testing.assert_array_equal(
      objective_lib.bce_targets(LABELS, 3, 0.3, threshold=0.2).numpy(),
      [[1, 0, 0], [0, 0, 1]])
  # Mixed targets: a partner weighted 0.3 > 0.2 becomes a positive too;
  # 0.2 itself does not (strictly above).
  mixed = tf.constant([[0.7, 0.3, 0.0], [0.2, 0.05, 0.75]])
  np.testing.assert_array_equal(
      objective_lib.bce_targets(mixed, 3, 0.3, threshold=0.2).numpy(),
      [[1, 1, 0], [0, 0, 1]])
  np.testing.assert_allclose(
      objective_lib.bce_targets(mixed, 3, 0.3).numpy(), mixed.numpy())


def test_binary_cross_entropy_sums_over_the_classes():
  # Per class softplus(z) - t * z; targets one-hot [0] and [2]:
  # (softplus(2) - 2) + softplus(0) + softplus(-1)
  #   = 0.126928 + 0.693147 + 0.313262 = 1.133337;
  # softplus(0) + softplus(1) + (softplus(-2) + 2)
  #   = 0.693147 + 1.313262 + 2.126928 = 4.133337.
  np.testing.assert_allclose(
      objective_lib.binary_cross_entropy(LABELS, LOGITS, 3).numpy(),
      [1.133337, 4.133337], atol=2e-6)
  # Soft targets, thresholded at 0.15: [1, 1, 0] and [0, 0, 1]; the second
  # positive of the first has z = 0, so t * z changes nothing.
  np.testing.assert_allclose(
      objective_lib.binary_cross_entropy(SOFT, LOGITS, 3,
                                         threshold=0.15).numpy(),
      [1.133337, 4.133337], atol=2e-6)
  # bf16 logits are computed on in float32.
  assert objective_lib.binary_cross_entropy(
      LABELS, tf.cast(LOGITS, tf.bfloat16), 3).dtype == tf.float32


def test_count_correct_on_indices_and_on_soft_targets():
  # Top classes: probs 0 and 2, logits 0 and 1.
  assert float(objective_lib.count_correct(LABELS, PROBS)) == 2.0
  assert float(objective_lib.count_correct(LABELS, LOGITS)) == 1.0
  assert float(objective_lib.count_correct(SOFT, PROBS)) == 2.0
  assert float(objective_lib.count_correct(SOFT, LOGITS)) == 1.0


def _objective(loss, accumulation):
  tf_keras.utils.set_random_seed(3)
  inputs = tf_keras.Input((4,))
  logits = tf_keras.layers.Dense(3, name='fc')(inputs)
  probs = tf_keras.layers.Activation('softmax', name='probs')(logits)
  model = tf_keras.Model(inputs, probs)
  return objective_lib.Objective(
      model=model, optimizer=tf_keras.optimizers.legacy.SGD(0.1),
      backend=distribution.Backend(tf.distribute.get_strategy()),
      num_classes=3, program_batch_size=4, loss=loss,
      bce_target_threshold=0.2 if loss == 'bce' else 0.0,
      logits_model=tf_keras.Model(inputs, logits),
      num_accumulation_steps=accumulation)


@pytest.mark.parametrize('loss', ['softmax', 'bce'])
def test_soft_targets_train_alike_with_and_without_accumulation(loss):
  images = tf.constant(np.arange(16, dtype=np.float32).reshape(4, 4) / 16)
  targets = tf.constant([[0.7, 0.3, 0.0], [0.0, 0.1, 0.9], [0.5, 0.5, 0.0],
                         [0.0, 0.0, 1.0]])
  whole = _objective(loss, 1)
  before = time.time()
  grads, total, correct, own_done = whole.gradients(images, targets)
  assert before <= float(own_done) <= time.time()
  per_example = (
      objective_lib.binary_cross_entropy(targets,
                                         whole.logits_model(images), 3,
                                         threshold=0.2)
      if loss == 'bce' else
      objective_lib.cross_entropy(targets, whole.model(images), 3))
  assert float(total) == pytest.approx(float(tf.reduce_mean(per_example)))
  assert float(correct) == float(objective_lib.count_correct(
      targets, whole.model(images)))
  split = _objective(loss, 2)
  split_grads, split_total, split_correct, _ = split.gradients(images,
                                                              targets)
  assert float(split_total) == pytest.approx(float(total), rel=1e-6)
  assert float(split_correct) == float(correct)
  for g, s in zip(grads, split_grads):
    np.testing.assert_allclose(s.numpy(), g.numpy(), rtol=1e-5, atol=1e-7)


def test_bce_needs_the_logits():
  with pytest.raises(ValueError, match='logits_model'):
    objective_lib.Objective(
        model=None, optimizer=None, backend=None, num_classes=3,
        program_batch_size=4, loss='bce')
