"""Synthetic data: one random batch, generated once and repeated.

It needs no files and costs no host time per step, so it measures the device
and the training loop alone. Evaluation data is finite (`num_examples`) and
ends with a partial batch when the count is not a multiple of the batch size,
exactly like real validation data.
"""

import tensorflow as tf

from resnet_keras.data import augment
from resnet_keras.data.preprocessing import normalize_images


def _random_batch(batch_size, image_size, num_classes, image_dtype, seed):
  pixels = tf.random.stateless_uniform(
      [batch_size, image_size, image_size, 3], seed=[seed, 1], minval=0,
      maxval=256, dtype=tf.int32)
  if image_dtype == tf.uint8:
    images = tf.cast(pixels, tf.uint8)
  else:
    images = normalize_images(pixels, image_dtype)
  labels = tf.random.stateless_uniform(
      [batch_size], seed=[seed, 2], minval=0, maxval=num_classes,
      dtype=tf.int32)
  return images, labels


def train_dataset(batch_size: int, image_size: int, num_classes: int,
                  image_dtype: tf.DType, seed: int = 0,
                  mixing: augment.BatchMixing = augment.BatchMixing()
                  ) -> tf.data.Dataset:
  """An endless dataset of one fixed batch; with `mixing`, mixed a new way
  each step (the loss sees soft targets, as with real data)."""
  batch = _random_batch(batch_size, image_size, num_classes, image_dtype, seed)
  return augment.mix_batches(tf.data.Dataset.from_tensors(batch).repeat(),
                             mixing, seed)


def eval_dataset(batch_size: int, image_size: int, num_classes: int,
                 image_dtype: tf.DType, num_examples: int,
                 seed: int = 1) -> tf.data.Dataset:
  """`num_examples` examples in batches; the last batch may be partial."""
  images, labels = _random_batch(batch_size, image_size, num_classes,
                                 image_dtype, seed)
  sizes = [batch_size] * (num_examples // batch_size)
  if num_examples % batch_size:
    sizes.append(num_examples % batch_size)
  return tf.data.Dataset.from_tensor_slices(tf.constant(sizes, tf.int32)).map(
      lambda n: (images[:n], labels[:n]))
