"""Corrupt shards: a one-line error naming the file, or skipped and counted."""

import json
import os
import shutil

import pytest
import tensorflow as tf

from resnet_keras.data import imagenet
from tests import e2e
from tests.imagenet_fixture import append_undecodable, truncate, write_dataset


@pytest.fixture(scope='module')
def clean_dir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('clean'))
  write_dataset(root)
  return root


def _copy(clean_dir, tmp_path):
  root = str(tmp_path / 'data')
  shutil.copytree(clean_dir, root)
  return root


def _shard(root, split, index):
  return imagenet.find_shards(root, split)[index]


def test_find_corrupt_file_names_truncated_and_undecodable_shards(
    clean_dir, tmp_path):
  root = _copy(clean_dir, tmp_path)
  files = imagenet.find_shards(root, 'train')
  assert imagenet.find_corrupt_file(files) is None
  truncate(files[1])
  path, reason = imagenet.find_corrupt_file(files)
  assert path == files[1] and 'record' in reason
  append_undecodable(files[2])
  assert imagenet.find_corrupt_file([files[0], files[2]])[0] == files[2]


def test_skipping_counts_undecodable_images_and_keeps_the_rest(clean_dir,
                                                              tmp_path):
  root = _copy(clean_dir, tmp_path)
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
  root = _copy(clean_dir, tmp_path)
  files = imagenet.find_shards(root, 'validation')
  append_undecodable(files[0])
  skipped = imagenet.SkippedRecords()
  ds = imagenet.dataset(files, is_training=True, batch_size=7, image_size=32,
                        dtype=tf.uint8, num_classes=3, skipped=skipped,
                        cache=True, crop_min_area=1.0, seed=1)
  assert [int(labels.shape[0]) for _, labels in ds.take(3)] == [7, 7, 7]
  assert skipped.count == 1   # decoded once, before the cache


def _train(root, model_dir, *extra):
  return e2e.run_main(['-dd', root, '-md', model_dir, '--resnet_depth=10',
                       '--width_multiplier=0.25', '--image_size=32',
                       '--batch_size=4', '-te', '1',
                       '--steps_per_loop=2', '--log_steps=2'] + list(extra))


def test_corrupt_shard_stops_with_one_line_naming_it(clean_dir, tmp_path):
  root = _copy(clean_dir, tmp_path)
  bad = _shard(root, 'validation', 1)
  truncate(bad)
  result = _train(root, str(tmp_path / 'run'))
  e2e.assert_one_line_error(result, 'corrupt record in ' + bad,
                            '--skip_corrupt_records')


def test_skip_corrupt_records_trains_and_reports(clean_dir, tmp_path):
  root = _copy(clean_dir, tmp_path)
  # The converter's metadata: the counts before the damage.
  with open(os.path.join(root, imagenet.METADATA_FILE), 'w') as f:
    json.dump({'num_classes': 3,
               'num_examples': {'train': 17, 'validation': 7}}, f)
  append_undecodable(_shard(root, 'train', 0))
  truncate(_shard(root, 'validation', 1), keep_fraction=0.5)
  model_dir = str(tmp_path / 'run')
  result = _train(root, model_dir, '--skip_corrupt_records')
  assert result.returncode == 0, result.stderr[-3000:]
  summary = e2e.read_summary(model_dir)
  assert summary['skipped_corrupt_records'] >= 1   # once per epoch read
  assert 4 <= summary['eval_examples'] < 7         # shard 1 cut short
  assert 'evaluated %d of 7 validation examples' % summary[
      'eval_examples'] in result.stderr
