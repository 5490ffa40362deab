"""--stem_init=pca: the stem's convolution (network.STEM_CONV) started from
the principal directions of patches of the first training images, rather
than at random; start.py decides when (a fresh run only).
"""

import dataclasses
from typing import Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.model.network import STEM_CONV

# Patches whose covariance --stem_init=pca estimates (dimensions <= 147).
PCA_PATCHES = 100_000


def pca_image_count(image_size: int, kernel_size: int) -> int:
  """Images of `image_size` that hold PCA_PATCHES non-overlapping patches."""
  per_image = (image_size // kernel_size) ** 2
  return max(1, -(-PCA_PATCHES // per_image))


def stem_patches(images: tf.Tensor, kernel_size: int) -> np.ndarray:
  """Non-overlapping `kernel_size` patches of normalised `images` [N, H, W,
  C] as rows [P, k * k * C], ordered as a Conv2D kernel's first three axes
  flattened."""
  k = kernel_size
  patches = tf.image.extract_patches(
      images, sizes=[1, k, k, 1], strides=[1, k, k, 1],
      rates=[1, 1, 1, 1], padding='VALID')
  return patches.numpy().reshape(-1, patches.shape[-1]).astype(np.float64)


def pca_stem_kernel(patches: np.ndarray, kernel: np.ndarray
                    ) -> Tuple[np.ndarray, int, float]:
  """`kernel` [k, k, C, F] with its first filters replaced by the principal
  directions of `patches` [P, k * k * C], in +/- pairs, largest variance
  first, each scaled to the root-mean-square norm of `kernel`'s filters.

  A random stem sees mostly the local brightness, the patches' dominant
  direction, in every filter: its channels start as near-copies, and batch
  norm cannot decorrelate them. The principal directions, each normalised
  by the batch norm after it, make the stem's output start white over the
  directions it keeps (airbench's whitening layer, here trainable). Only
  directions of non-negligible variance are used (grey images in RGB have
  rank k * k) and at most F // 2; the other filters keep their values.
  Returns (kernel, directions used, fraction of the variance they hold).
  """
  variances, directions = np.linalg.eigh(np.cov(patches, rowvar=False))
  order = np.argsort(variances)[::-1]
  variances, directions = variances[order], directions[:, order]
  rank = int(np.sum(variances > 1e-6 * variances[0]))
  used = min(rank, kernel.shape[-1] // 2)
  flat = kernel.reshape(-1, kernel.shape[-1]).copy()
  norm = np.sqrt(np.mean(np.sum(flat ** 2, axis=0)))
  for i in range(used):
    flat[:, 2 * i] = directions[:, i] * norm
    flat[:, 2 * i + 1] = -directions[:, i] * norm
  held = float(np.sum(variances[:used]) / np.sum(variances))
  return flat.reshape(kernel.shape), used, held


def init_stem_from_images(network: tf_keras.Model, images: tf.Tensor
                          ) -> Tuple[int, int, float]:
  """--stem_init=pca on a built ResNet from normalised `images`: returns
  (directions used, the stem's filters, fraction of the patch variance)."""
  conv = network.get_layer(STEM_CONV)
  kernel_size = conv.kernel.shape[0]
  kernel, used, held = pca_stem_kernel(stem_patches(images, kernel_size),
                                       conv.kernel.numpy())
  conv.kernel.assign(kernel)
  return used, kernel.shape[-1], held


def init_stem_from_training_images(cfg: RunConfig, info: datasets.DatasetInfo,
                                   network: tf_keras.Model) -> None:
  """--stem_init=pca: the stem's filters from patches of the first training
  images in file order, preprocessed as evaluation does at the training
  size; the same images on every worker (Horovod's then take the chief's
  weights anyway)."""
  kernel_size = network.get_layer(STEM_CONV).kernel.shape[0]
  count = pca_image_count(cfg.image_size, kernel_size)
  sized = dataclasses.replace(cfg, eval_image_size=cfg.image_size)
  pixels, _ = next(iter(datasets.pixel_batches(
      sized, info, count, from_training=True, limit=count)))
  used, filters, held = init_stem_from_images(
      network, normalize_images(pixels))
  logging.info('stem: %d of its %d filters start as +/- the %d principal '
               'directions of %dx%d patches of %d training images (%.1f%% '
               'of their variance)', 2 * used, filters, used, kernel_size,
               kernel_size, int(pixels.shape[0]), 100 * held)
