"""A model_dir written by the code before the architecture redesign (commit
555cf07, kept in tests/data/legacy_run: ResNet-10 x0.125 on 16 px synthetic
images, 2 steps of SGD with a weight average, ckpt-2, config.json, its
SavedModel) resumes, validates and exports with today's code, which
computes what the old code did."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.serving import contract
from resnet_keras.serving import readers
from tests.support import runner

LEGACY_RUN = os.path.join(runner.REPO_ROOT, 'tests', 'data', 'legacy_run')
# The command line that wrote it, but for --train_epochs (1) and
# --model_dir; config.json records the same values.
ARGS = ['--use_synthetic_data', '--resnet_depth=10', '--width_multiplier=0.125',
        '--image_size=16', '--stem=small', '--num_classes=4', '--batch_size=4',
        '--train_steps=2', '--steps_per_loop=2', '--log_steps=1',
        '--num_eval_examples=4', '--global_seed=1', '--ema_decay=0.9',
        '--enable_checkpoint_and_export', '--max_checkpoints=1']
# Its evaluation at step 2 (metrics.jsonl), of the weight average.
LEGACY_EVAL_LOSS = 3.1018424034118652


@pytest.fixture
def legacy_dir(tmp_path):
  path = str(tmp_path / 'legacy')
  shutil.copytree(LEGACY_RUN, path)
  return path


@pytest.mark.slow
def test_it_resumes_to_the_weights_of_a_run_made_today(legacy_dir, tmp_path):
  resumed = runner.run_main(ARGS + ['-md', legacy_dir, '-te', '2'])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'restored from' in resumed.stderr
  assert 'weight average (resumed from' in resumed.stderr
  summary = runner.read_summary(legacy_dir)
  assert summary['resumed_from_step'] == 2 and summary['train_steps'] == 4
  straight_dir = str(tmp_path / 'straight')
  straight = runner.run_main(ARGS + ['-md', straight_dir, '-te', '2'])
  assert straight.returncode == 0, straight.stderr[-3000:]
  # Every variable of the last checkpoint (weights, their average, the
  # momentum, the step) within rounding, not bit for bit: the legacy steps
  # ran on an AVX-512 CPU, and other kernels (oneDNN's AVX2 ones, say)
  # round the straight run's first two steps differently (by 2.4e-7 at most
  # there), where two steps move the median variable by ~7e-5.
  resumed_vars = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(legacy_dir))
  straight_vars = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(straight_dir))
  names = resumed_vars.get_variable_to_dtype_map()
  assert names == straight_vars.get_variable_to_dtype_map()
  for name, dtype in names.items():
    if dtype == tf.string:  # the checkpoint's object graph
      assert resumed_vars.get_tensor(name) == straight_vars.get_tensor(name)
      continue
    np.testing.assert_allclose(resumed_vars.get_tensor(name),
                               straight_vars.get_tensor(name),
                               rtol=1e-5, atol=5e-6, err_msg=name)
  assert summary['eval_loss'] == pytest.approx(
      runner.read_summary(straight_dir)['eval_loss'], rel=1e-5)


@pytest.mark.slow
def test_it_validates_as_it_evaluated_and_exports_its_saved_model(legacy_dir):
  result = runner.run_tool('resnet_keras.validate', ['--model_dir', legacy_dir])
  assert result.returncode == 0, result.stderr[-3000:]
  row = result.stdout.splitlines()[1].split()
  assert row[0] == 'ckpt-2' and row[1] == '2'
  assert float(row[-1]) == pytest.approx(LEGACY_EVAL_LOSS, abs=1e-4)  # loss

  exported = runner.run_tool('resnet_keras.export', ['--model_dir', legacy_dir])
  assert exported.returncode == 0, exported.stderr[-3000:]
  pixels = np.random.RandomState(0).randint(0, 256, (3, 16, 16, 3),
                                            ).astype(np.uint8)
  old = readers.load(os.path.join(legacy_dir, contract.CLASSIFIER_DIR))
  new = readers.load(os.path.join(legacy_dir, contract.EXPORTS_DIR, 'ckpt-2',
                                  contract.CLASSIFIER_DIR))
  assert old.image_size == new.image_size == 16
  assert old.num_classes == new.num_classes == 4
  # The export at the run's end and today's export of its last checkpoint:
  # the same weight average, the same probabilities.
  np.testing.assert_allclose(new(pixels), old(pixels), rtol=1e-5, atol=1e-6)
