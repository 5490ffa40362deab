"""Corrupt shards in the ImageNet pipeline (resnet_keras/data/imagenet.py):
found and named, or skipped and counted. (What a run does with them: e2e/.)"""

import pytest
import tensorflow as tf

from resnet_keras.data import imagenet
from tests.support.records import append_undecodable, copy_dataset, truncate


def test_find_corrupt_file_names_truncated_and_undecodable_shards(
    clean_dir, tmp_path):
  root = copy_dataset(clean_dir, tmp_path)
  files = imagenet.find_shards(root, 'train')
  assert imagenet.find_corrupt_file(files) is None
  truncate(files[1])
  path, reason = imagenet.find_corrupt_file(files)
  assert path == files[1] and 'record' in reason
  append_undecodable(files[2])
  assert imagenet.find_corrupt_file([files[0], files[2]])[0] == files[2]


def test_skipping_counts_undecodable_images_and_keeps_the_rest(clean_dir,
                                                              tmp_path):
  root = copy_dataset(clean_dir, tmp_path)
  files = imagenet.find_shards(root, 'validation')
  append_undecodable(files[0])
  append_undecodable(files[1])
  skipped = imagenet.SkippedRecords()
  ds = imagenet.dataset(files, is_training=False, batch_size=3, image_size=32,
                        dtype=tf.float32, num_classes=3, skipped=skipped)
  assert sum(int(labels.shape[0]) for _, labels in ds) == 7  # 4 + 3 good
  assert skipped.count == 2
  with pytest.raises(tf.errors.InvalidArgumentError):  # Without: an error.
    list(imagenet.dataset(files, is_training=False, batch_size=3,
                          image_size=32, dtype=tf.float32, num_classes=3))


def test_a_decoded_cache_skips_undecodable_images_once(clean_dir, tmp_path):
  root = copy_dataset(clean_dir, tmp_path)
  files = imagenet.find_shards(root, 'validation')
  append_undecodable(files[0])
  skipped = imagenet.SkippedRecords()
  ds = imagenet.dataset(files, is_training=True, batch_size=7, image_size=32,
                        dtype=tf.uint8, num_classes=3, skipped=skipped,
                        cache=True, crop_min_area=1.0, seed=1)
  assert [int(labels.shape[0]) for _, labels in ds.take(3)] == [7, 7, 7]
  assert skipped.count == 1   # decoded once, before the cache
