"""Pixel normalisation shared by the input pipeline, the model and export.

Images are RGB in 0-255 with the ImageNet per-channel mean subtracted (no
division by the standard deviation, as in the Model Garden ResNet). Where it
runs is a choice: on the host in the input pipeline (fp32/bf16 loaders), or on
the device as the model's first layer (uint8 loader: a quarter of the bytes
cross the host-device link).

Training order: `training_order` shuffles and repeats records and numbers
them; augmentation is keyed by that number (stateless random ops). With a
seed, the order and every crop are functions of (seed, position), so a run
resumed at step k skips the records the first k steps consumed and then
sees exactly what the uninterrupted run saw.
"""

import random
from typing import Optional

import tensorflow as tf

MEAN_RGB = (123.68, 116.78, 103.94)


def normalize_images(images, dtype=tf.float32):
  """Casts 0-255 RGB images to float32, subtracts the mean, casts to dtype."""
  images = tf.cast(images, tf.float32)
  # Subtracting a full-size tensor: Eigen's broadcast of a 3-vector over the
  # channel axis costs twice as much on CPU (0.36 vs 0.19 ms per 224x224
  # image, ~15% of the whole training preprocessing).
  means = tf.broadcast_to(tf.constant(MEAN_RGB, tf.float32), tf.shape(images))
  return tf.cast(images - means, dtype)


def with_private_threads(ds, num_threads: int):
  """`ds` on a private tf.data threadpool of `num_threads` (0: shared)."""
  if not num_threads:
    return ds
  options = tf.data.Options()
  options.threading.private_threadpool_size = num_threads
  return ds.with_options(options)


def training_order(ds, shuffle_buffer: int, seed: Optional[int],
                   start: int = 0, repeats: int = 1):
  """(position, record) pairs: shuffled, repeated, from position `start`.

  With `repeats` > 1 (repeated augmentation) each record comes that many
  times in a row, each copy at a position of its own and so augmented
  differently; the epoch keeps its length, so it holds 1/repeats of the
  records (as DeiT's RASampler). The copies are consecutive, in one batch
  (Hoffer et al.'s batch augmentation); under sharding each pipeline
  repeats only its own records, so the shares stay disjoint.
  """
  ds = ds.shuffle(shuffle_buffer, seed=seed).repeat()
  if repeats > 1:
    ds = ds.flat_map(lambda *element: tf.data.Dataset.from_tensors(
        element if len(element) > 1 else element[0]).repeat(repeats))
  ds = ds.enumerate()
  return ds.skip(start) if start else ds


def augmentation_seed(seed: Optional[int], position, salt: int = 0):
  """A stateless-op seed for the record at `position` (None: a fresh one
  per pipeline, drawn once)."""
  base = seed if seed is not None else random.SystemRandom().randrange(2**31)
  return tf.stack([tf.constant(base + salt, tf.int64),
                   tf.cast(position, tf.int64)])
