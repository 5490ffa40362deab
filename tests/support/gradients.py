"""What the network's and the layers' tests share (unit/test_network.py,
unit/test_layers.py): a batch's loss through a model, and its gradients;
networks built without drawing their kernels."""

import tensorflow as tf
import tf_keras


def loss_and_grads(model, images, labels, training=True):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf_keras.losses.sparse_categorical_crossentropy(
        labels, model(images, training=training)))
  return loss, tape.gradient(loss, model.trainable_variables)


def unfilled_kernels(monkeypatch):
  """Networks built from here on (until `monkeypatch` undoes it) start their
  convolutions' kernels as zeros, not he_normal draws: for a network whose
  parameters are only counted, or set from another's. The draws are 40% of
  building a ResNet-152."""
  monkeypatch.setattr(
      tf_keras.initializers.VarianceScaling, '__call__',
      lambda self, shape, dtype=None, **kwargs: tf.zeros(shape,
                                                         dtype or 'float32'))
