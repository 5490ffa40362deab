"""Runs on corrupt shards: a one-line error naming the file, or
--skip_corrupt_records skipping and counting them."""

import json
import os

import pytest

from resnet_keras.data import imagenet
from tests.support import runner
from tests.support.records import append_undecodable, copy_dataset, truncate


def _shard(root, split, index):
  return imagenet.find_shards(root, split)[index]


def _train(root, model_dir, *extra):
  return runner.run_main(['-dd', root, '-md', model_dir, '--resnet_depth=10',
                          '--width_multiplier=0.25', '--image_size=32',
                          '--batch_size=4', '-te', '1',
                          '--steps_per_loop=2', '--log_steps=2'] + list(extra))


def test_corrupt_shard_stops_with_one_line_naming_it(clean_dir, tmp_path):
  root = copy_dataset(clean_dir, tmp_path)
  bad = _shard(root, 'validation', 1)
  truncate(bad)
  result = _train(root, str(tmp_path / 'run'))
  runner.assert_one_line_error(result, 'corrupt record in ' + bad,
                               '--skip_corrupt_records')


@pytest.mark.slow
def test_skip_corrupt_records_trains_and_reports(clean_dir, tmp_path):
  root = copy_dataset(clean_dir, tmp_path)
  # The converter's metadata: the counts before the damage.
  with open(os.path.join(root, imagenet.METADATA_FILE), 'w') as f:
    json.dump({'num_classes': 3,
               'num_examples': {'train': 17, 'validation': 7}}, f)
  append_undecodable(_shard(root, 'train', 0))
  truncate(_shard(root, 'validation', 1), keep_fraction=0.5)
  model_dir = str(tmp_path / 'run')
  result = _train(root, model_dir, '--skip_corrupt_records')
  assert result.returncode == 0, result.stderr[-3000:]
  summary = runner.read_summary(model_dir)
  assert summary['skipped_corrupt_records'] >= 1   # once per epoch read
  assert 4 <= summary['eval_examples'] < 7         # shard 1 cut short
  assert 'evaluated %d of 7 validation examples' % summary[
      'eval_examples'] in result.stderr
