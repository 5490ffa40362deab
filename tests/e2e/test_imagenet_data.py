"""Runs on tiny ImageNet-format records, through the trainer's main in this
process: trained and evaluated end to end, a missing --data_dir."""

import pytest

from tests.support import runner


@pytest.mark.slow
def test_train_and_eval_end_to_end_on_records(data_dir, tmp_path):
  root, labels = data_dir
  model_dir = str(tmp_path / 'run')
  result = runner.run_main(['-dd', root, '-md', model_dir, '--resnet_depth=10',
                            '--width_multiplier=0.25', '--image_size=32',
                            '--batch_size=4', '-te', '2',
                            '--steps_per_loop=2', '--log_steps=2',
                            '-dlit', 'uint8', '--training_dataset_cache',
                            '--datasets_num_private_threads=2'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['eval_examples'] == 7           # 7 = 4 + 3: partial batch
  assert summary['num_classes'] == 3
  assert summary['steps_per_epoch'] == 4         # 17 // 4
  assert summary['train_steps'] == 8


def test_missing_data_dir_is_one_line(tmp_path):
  model_dir = tmp_path / 'run'
  result = runner.run_main(['-dd', str(tmp_path / 'nothing'), '-md',
                            str(model_dir), '--image_size=32'])
  runner.assert_one_line_error(result, 'nothing', 'does not exist')
  assert not model_dir.exists()
