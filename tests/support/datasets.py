"""Tiny datasets in the other formats the code reads: CIFAR binary batches
(resnet_keras/data/cifar.py) and Fashion-MNIST's gzipped IDX files
(resnet_keras/data/fashion_mnist.py). ImageNet-format records: records.py."""

import gzip

import numpy as np

# Fake Fashion-MNIST splits: training and test images.
NUM_TRAIN = 20
NUM_TEST = 12


def write_cifar(path, labels, label_bytes, seed):
  """A CIFAR binary file of random 32x32 images with `labels` (the last of
  `label_bytes` label bytes); returns the images, HWC."""
  rng = np.random.RandomState(seed)
  images = rng.randint(0, 256, [len(labels), 3, 32, 32]).astype(np.uint8)
  with open(path, 'wb') as f:
    for label, image in zip(labels, images):
      f.write(bytes([7] * (label_bytes - 1) + [label]) + image.tobytes())
  return images.transpose(0, 2, 3, 1)   # to HWC


def idx_bytes(array):
  """IDX encoding: zero bytes, type code 0x08 (ubyte), ndim, dims big-endian."""
  header = bytes([0, 0, 0x08, array.ndim])
  header += b''.join(d.to_bytes(4, 'big') for d in array.shape)
  return header + array.astype('>u1').tobytes()


def write_idx(path, array):
  with gzip.open(path, 'wb') as f:
    f.write(idx_bytes(array))


def fake_split(n, seed):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
  labels = (np.arange(n) * 7 + seed) % 10  # every class, in mixed order
  return images, labels.astype(np.uint8)
