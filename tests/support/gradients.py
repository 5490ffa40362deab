"""What the network's and the layers' tests share (unit/test_network.py,
unit/test_layers.py): a batch's loss through a model, and its gradients."""

import tensorflow as tf
import tf_keras


def loss_and_grads(model, images, labels, training=True):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf_keras.losses.sparse_categorical_crossentropy(
        labels, model(images, training=training)))
  return loss, tape.gradient(loss, model.trainable_variables)
