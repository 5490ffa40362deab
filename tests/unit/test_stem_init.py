"""--stem_init=pca (resnet_keras/model/stem_init.py): the stem's filters from
the principal directions of image patches, in +/- pairs."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.model import network as network_lib
from resnet_keras.model import stem_init
from resnet_keras.data.preprocessing import normalize_images


def _pairs_of(kernel, used):
  """The first 2 * used filters of `kernel` as (direction, its negative)."""
  flat = kernel.reshape(-1, kernel.shape[-1])
  return [(flat[:, 2 * i], flat[:, 2 * i + 1]) for i in range(used)]


@pytest.mark.parametrize('filters,used,held', [(8, 3, 1.0), (4, 2, 26 / 28)])
def test_pca_stem_kernel_takes_the_largest_directions_in_pairs(filters, used,
                                                               held):
  # Patches along the axes: variances 18/5, 2/5, 8/5 and 0 (np.cov's n - 1),
  # so the directions by variance are axes 0, 2, 1; axis 3 has none.
  patches = np.array([[3., 0, 0, 0], [-3, 0, 0, 0], [0, 1, 0, 0],
                      [0, -1, 0, 0], [0, 0, 2, 0], [0, 0, -2, 0]])
  kernel = np.random.default_rng(0).normal(size=(1, 1, 4, filters))
  norm = np.sqrt(np.mean(np.sum(kernel.reshape(4, -1) ** 2, axis=0)))
  result, got_used, got_held = stem_init.pca_stem_kernel(patches, kernel)
  assert (got_used, result.shape) == (used, kernel.shape)
  assert got_held == pytest.approx(held)
  for (plus, minus), axis in zip(_pairs_of(result, used), (0, 2, 1)):
    np.testing.assert_allclose(np.abs(plus), np.eye(4)[axis] * norm,
                               atol=1e-12)
    np.testing.assert_array_equal(minus, -plus)
  # The filters past the pairs keep their random values.
  np.testing.assert_array_equal(result[..., 2 * used:],
                                kernel[..., 2 * used:])


def test_stem_patches_are_laid_out_as_the_kernel():
  images = tf.reshape(tf.range(2 * 4 * 4 * 3, dtype=tf.float32), [2, 4, 4, 3])
  patches = stem_init.stem_patches(images, 2)
  assert patches.shape == (2 * 4, 2 * 2 * 3)
  # Row 3: the first image's bottom-right patch, flattened as a Conv2D
  # kernel's (height, width, channels) axes: its dot product with a kernel
  # filter is the convolution's output there.
  np.testing.assert_array_equal(patches[3],
                                images[0, 2:4, 2:4, :].numpy().reshape(-1))
  assert stem_init.pca_image_count(28, 3) == 1235  # 81 patches an image
  assert stem_init.pca_image_count(224, 7) == 98


def test_pca_stem_on_grey_images_uses_their_rank_and_decorrelates():
  """Grey images in RGB: 3x3 patches have rank 9, so 18 of the small stem's
  32 filters become +/- pairs of orthogonal directions, and the stem's
  outputs along them are uncorrelated on the images it was fitted to."""
  rng = np.random.default_rng(1)
  grey = rng.integers(0, 256, size=(64, 28, 28, 1)).astype(np.float32)
  grey = tf.nn.avg_pool2d(grey, 3, 1, 'SAME')  # neighbours correlate
  images = normalize_images(tf.repeat(grey, 3, axis=-1))
  tf_keras.utils.set_random_seed(2)
  net = network_lib.resnet(10, 10, 28, stem='small', filters=(32, 16, 16, 16))
  before = net.get_layer(network_lib.STEM_CONV).kernel.numpy()
  used, filters, held = stem_init.init_stem_from_images(net, images)
  assert (used, filters) == (9, 32) and held == pytest.approx(1.0)
  after = net.get_layer(network_lib.STEM_CONV).kernel.numpy()
  np.testing.assert_array_equal(after[..., 18:], before[..., 18:])
  directions = np.stack([plus for plus, _ in _pairs_of(after, used)])
  gram = directions @ directions.T
  np.testing.assert_allclose(gram, np.diag(np.diag(gram)), atol=1e-5)
  responses = stem_init.stem_patches(images, 3) @ directions.T
  correlation = np.corrcoef(responses, rowvar=False)
  np.testing.assert_allclose(correlation, np.eye(9), atol=1e-6)
  # A random stem's responses are strongly correlated: what PCA removes.
  random_responses = stem_init.stem_patches(images, 3) @ before.reshape(27, -1)
  off_diagonal = np.corrcoef(random_responses, rowvar=False)[np.triu_indices(
      32, 1)]
  assert np.max(np.abs(off_diagonal)) > 0.5
