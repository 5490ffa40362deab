"""CIFAR binary files (resnet_keras/data/cifar.py): decoding, augmentation
shapes, sizes, errors, pipeline flags. (A run on them: e2e/.)"""

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.data import cifar
from common.errors import UsageError
from tests.support.datasets import write_cifar


def test_decodes_labels_and_channel_major_pixels(cifar10_dir):
  root, images = cifar10_dir
  files = cifar.find_files(str(root), 'cifar10', 'validation')
  ds = cifar.dataset(files, 'cifar10', is_training=False, batch_size=2,
                     image_size=32, dtype=tf.uint8)
  batches = list(ds)
  assert [len(y) for _, y in batches] == [2, 1]
  np.testing.assert_array_equal(batches[0][0].numpy(), images[:2])
  assert np.concatenate([y.numpy() for _, y in batches]).tolist() == [1, 2, 3]


def test_cifar100_uses_the_fine_label(tmp_path):
  write_cifar(tmp_path / 'train.bin', [42, 99], 2, 0)
  write_cifar(tmp_path / 'test.bin', [5], 2, 1)
  files = cifar.find_files(str(tmp_path), 'cifar100', 'train')
  assert cifar.count_examples(files, 'cifar100') == 2
  (x, y), = cifar.dataset(files, 'cifar100', is_training=False, batch_size=2,
                          image_size=32, dtype=tf.float32)
  assert y.numpy().tolist() == [42, 99]


def test_training_augmentation_shapes(cifar10_dir):
  root, _ = cifar10_dir
  files = cifar.find_files(str(root), 'cifar10', 'train')
  assert cifar.count_examples(files, 'cifar10') == 10
  x, y = next(iter(cifar.dataset(files, 'cifar10', is_training=True,
                                 batch_size=4, image_size=40,
                                 dtype=tf.bfloat16)))
  assert x.shape == (4, 40, 40, 3) and x.dtype == tf.bfloat16


def test_missing_and_truncated_files(tmp_path):
  with pytest.raises(UsageError, match='data_batch_1.bin'):
    cifar.find_files(str(tmp_path), 'cifar10', 'train')
  (tmp_path / 'test.bin').write_bytes(b'x' * 100)
  with pytest.raises(UsageError, match='truncated'):
    cifar.count_examples([str(tmp_path / 'test.bin')], 'cifar100')


def test_pipeline_flags_reach_the_dataset(cifar10_dir):
  root, _ = cifar10_dir
  files = cifar.find_files(str(root), 'cifar10', 'train')
  ds = cifar.dataset(files, 'cifar10', is_training=True, batch_size=2,
                     image_size=32, dtype=tf.uint8, cache=True,
                     num_private_threads=3)
  assert ds.options().threading.private_threadpool_size == 3
  graph = ds._as_serialized_graph().numpy()  # pylint: disable=protected-access
  assert b'CacheDataset' in graph
  plain = cifar.dataset(files, 'cifar10', is_training=True, batch_size=2,
                        image_size=32, dtype=tf.uint8)
  assert b'CacheDataset' not in plain._as_serialized_graph().numpy()  # pylint: disable=protected-access
