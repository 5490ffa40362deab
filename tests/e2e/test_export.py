"""python -m resnet_keras.export on a trained run: every checkpoint exported
as the run exported its last, and its one-line errors. (Exports of a
network, their signatures, feature vector and portable copy: unit/.)"""

import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.serving import contract
from tests.support import runner
from tests.support.images import uniform_pixels


def _export_tool(model_dir, *args, **kwargs):
  return runner.run_tool('resnet_keras.export',
                         ['--model_dir', model_dir] + list(args), **kwargs)


@pytest.mark.slow
def test_old_checkpoints_export_like_the_run_did(synthetic_run):
  result = _export_tool(synthetic_run, '--checkpoint', 'all')
  assert result.returncode == 0, result.stderr[-3000:]
  exports = os.path.join(synthetic_run, contract.EXPORTS_DIR)
  assert sorted(os.listdir(exports)) == ['ckpt-4', 'ckpt-8']
  pixels = tf.constant(uniform_pixels())

  def predict(path):
    return tf.saved_model.load(path).signatures['serving_default'](
        images=pixels)['probabilities'].numpy()

  at_end = predict(os.path.join(synthetic_run, contract.CLASSIFIER_DIR))
  last = predict(os.path.join(exports, 'ckpt-8', contract.CLASSIFIER_DIR))
  np.testing.assert_allclose(last, at_end, rtol=1e-6, atol=1e-7)
  earlier = predict(os.path.join(exports, 'ckpt-4', contract.CLASSIFIER_DIR))
  assert not np.allclose(earlier, at_end, rtol=1e-3)
  features = tf.saved_model.load(
      os.path.join(exports, 'ckpt-8', contract.FEATURE_VECTOR_DIR))
  # ResNet-10's last stage at a quarter width: 512 / 4 channels.
  assert features(pixels, training=False).shape == (3, 128)


def test_bad_inputs_fail_in_one_line(synthetic_run, tmp_path):
  (tmp_path / 'file').write_text('')
  for args, fragments in [
      (['--checkpoint', 'ckpt-5'], ['--checkpoint=ckpt-5 is not a checkpoint',
                                    'ckpt-4, ckpt-8']),
      (['--output_dir', str(tmp_path / 'file' / 'sub')],
       ['--output_dir=', 'cannot be created']),
  ]:
    runner.assert_one_line_error(_export_tool(synthetic_run, *args),
                                 *fragments)
  runner.assert_one_line_error(_export_tool(str(tmp_path / 'nowhere')),
                               'is not a directory')
  runner.assert_one_line_error(_export_tool(str(tmp_path)),
                               'config.json does not exist')
