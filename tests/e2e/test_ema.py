"""--ema_decay in a whole run (run.run in this process): it resumes the
weight average exactly and exports it. (The average against hand-computed
values, what evaluation scores, checkpoints: unit/.)"""

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.training import run as run_lib
from resnet_keras.config import RunConfig
from resnet_keras.serving import readers
from tests.support import runner


pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')


def _tiny(model_dir, **overrides) -> RunConfig:
  """3 steps of 4 synthetic images in one loop, 5 classes, 6 evaluation
  examples, a log record every step, seed 1; the average of decay 0.7."""
  return runner.tiny_config(model_dir, **{
      'num_classes': 5, 'batch_size': 4, 'log_steps': 1,
      'num_eval_examples': 6, 'global_seed': 1,
      'train_steps': 3, 'steps_per_loop': 3, 'ema_decay': 0.7,
      'ema_warmup': True, 'enable_checkpoint_and_export': True,
      **overrides})


def _averages(path):
  return runner.checkpoint_values(
      path, lambda name: name.startswith('weight_average/'))


@pytest.mark.slow
def test_a_run_resumes_its_average_exactly_and_exports_it(tmp_path):
  straight = run_lib.run(_tiny(tmp_path / 'straight', train_epochs=2))
  tf_keras.backend.clear_session()
  run_lib.run(_tiny(tmp_path / 'resumed'))
  tf_keras.backend.clear_session()
  resumed = run_lib.run(_tiny(tmp_path / 'resumed', train_epochs=2))
  assert resumed['resumed_from_step'] == 3 and resumed['train_steps'] == 6
  a, b = (_averages(str(tmp_path / d / 'ckpt-6'))
          for d in ('straight', 'resumed'))
  assert a and a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert resumed['eval_accuracy'] == straight['eval_accuracy']
  with open(tmp_path / 'straight' / 'config.json') as f:
    recorded = json.load(f)['config']
  assert recorded['ema_decay'] == 0.7 and recorded['ema_warmup']

  # The export holds the averages, not the trained weights: compare each
  # variable's sum of magnitudes, as multisets (checkpoint keys name
  # objects, not layers).
  path = str(tmp_path / 'straight' / 'ckpt-6')
  exported = tf.saved_model.load(str(tmp_path / 'straight' / 'saved_model'))
  sizes = lambda arrays: sorted(float(np.abs(x).sum()) for x in arrays)
  trained = list(runner.model_weights(path).values())
  assert len(trained) == len(a) == len(exported.variables)
  np.testing.assert_allclose(sizes(v.numpy() for v in exported.variables),
                             sizes(a.values()), rtol=1e-6)
  assert not np.allclose(sizes(trained), sizes(a.values()), rtol=1e-6)
  # The ONNX file of the last checkpoint is that same average.
  tf_keras.backend.clear_session()
  result = runner.run_tool('resnet_keras.export', [
      '--model_dir', str(tmp_path / 'straight'), '--format', 'onnx'])
  assert result.returncode == 0, result.stderr[-3000:]
  pixels = np.random.RandomState(0).randint(0, 256, (3, 32, 32, 3), np.uint8)
  onnx_file = readers.load(str(tmp_path / 'straight' / 'exports' / 'ckpt-6' /
                              'model.onnx'))
  np.testing.assert_allclose(
      onnx_file(pixels), readers.load(str(tmp_path / 'straight' /
                                          'saved_model'))(pixels),
      atol=1e-5)
