"""Pixel normalisation shared by the input pipeline, the model and export.

Images are RGB in 0-255 with the ImageNet per-channel mean subtracted (no
division by the standard deviation, as in the Model Garden ResNet). Where it
runs is a choice: on the host in the input pipeline (fp32/bf16 loaders), or on
the device as the model's first layer (uint8 loader: a quarter of the bytes
cross the host-device link).
"""

import tensorflow as tf

MEAN_RGB = (123.68, 116.78, 103.94)


def normalize_images(images, dtype=tf.float32):
  """Casts 0-255 RGB images to float32, subtracts the mean, casts to dtype."""
  images = tf.cast(images, tf.float32) - tf.constant(MEAN_RGB, tf.float32)
  return tf.cast(images, dtype)


def with_private_threads(ds, num_threads: int):
  """`ds` on a private tf.data threadpool of `num_threads` (0: shared)."""
  if not num_threads:
    return ds
  options = tf.data.Options()
  options.threading.private_threadpool_size = num_threads
  return ds.with_options(options)
