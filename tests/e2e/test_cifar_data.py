"""A run on CIFAR binary files (--dataset cifar10), through the trainer's
main in this process."""

import pytest

from tests.support import runner


@pytest.mark.slow
def test_train_end_to_end(cifar10_dir, tmp_path):
  root, _ = cifar10_dir
  model_dir = str(tmp_path / 'run')
  result = runner.run_main(['--dataset', 'cifar10', '-dd', str(root), '-md',
                            model_dir, '--resnet_depth', '10',
                            '--width_multiplier', '0.25', '--image_size', '32',
                            '-bs', '4', '--steps_per_loop', '2',
                            '--training_dataset_cache',
                            '--datasets_num_private_threads=2'])
  assert result.returncode == 0, result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['num_classes'] == 10 and summary['eval_examples'] == 3
  assert summary['steps_per_epoch'] == 2
