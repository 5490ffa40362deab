"""resnet_ctl_imagenet_main.py --enable_xla in processes of their own: XLA
compiles (TensorFlow's C++ log, read at start-up, says so) and computes
what the plain run does. (The other runs, in this process: e2e/.)"""

import os

import numpy as np
import tensorflow as tf

from tests.support import runner


def test_xla_compiles_and_computes_what_the_plain_run_does(tmp_path):
  """--enable_xla on a CPU really compiles (TensorFlow's C++ log says so),
  evaluates, checkpoints and exports what the same seeded run without it
  does, within float tolerance (XLA fuses and reorders the math)."""
  runs = {}
  for name, extra in (('plain', []), ('xla', ['--enable_xla'])):
    model_dir = str(tmp_path / name)
    result = runner.spawn_main(
        runner.TINY + ['-md', model_dir, '--global_seed=5',
                       '--enable_checkpoint_and_export'] + extra,
        env={'TF_CPP_MIN_LOG_LEVEL': '0'})
    assert result.returncode == 0, result.stderr[-3000:]
    runs[name] = (model_dir, result.stderr)
  assert 'Compiled cluster using XLA' in runs['xla'][1]
  assert 'Compiled cluster using XLA' not in runs['plain'][1]
  xla, plain = (runner.read_summary(runs[n][0]) for n in ('xla', 'plain'))
  assert xla['train_steps'] == 4 and xla['eval_examples'] == 13
  assert os.path.exists(os.path.join(runs['xla'][0], 'ckpt-4.index'))
  for key in ('train_loss', 'eval_loss'):
    np.testing.assert_allclose(xla[key], plain[key], rtol=1e-3)
  pixels = tf.constant(np.random.RandomState(0).uniform(
      0, 255, (3, 32, 32, 3)).astype(np.float32))
  served = [tf.saved_model.load(os.path.join(runs[n][0], 'saved_model'))
            .signatures['serving_default'](images=pixels)['probabilities']
            for n in ('xla', 'plain')]
  np.testing.assert_allclose(served[0], served[1], rtol=1e-3, atol=1e-5)
