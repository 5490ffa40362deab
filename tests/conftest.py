"""Shared test setup: TensorFlow set up as in production, and the tiny
trained runs the tool tests share."""

from common import env

env.prepare_tensorflow_environment()

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import e2e  # pylint: disable=g-import-not-at-top,wrong-import-position

# Class names of `records_run`'s labels.txt.
CLASS_NAMES = ('ant', 'bee', 'cat', 'dog', 'eel', 'fox')


@pytest.fixture
def fresh_tensorflow_state():
  """What a run changes process-wide, restored after the test: the Keras
  session and precision policy, and TensorFlow's Python log level."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  level = tf.get_logger().level
  yield
  tf_keras.backend.clear_session()
  tf_keras.mixed_precision.set_global_policy('float32')
  tf.get_logger().setLevel(level)


@pytest.fixture(scope='session')
def synthetic_run(tmp_path_factory):
  """model_dir of a tiny synthetic run: 2 epochs, ckpt-4, ckpt-8, export.

  Shared by the tool tests, which only read it (and add their outputs).
  """
  model_dir = tmp_path_factory.mktemp('synthetic_run') / 'model'
  e2e.train_tiny(model_dir)
  return str(model_dir)


@pytest.fixture(scope='session')
def records_run(tmp_path_factory):
  """(data_dir, model_dir) of a tiny run on ImageNet-format TFRecords.

  Six classes named in labels.txt, 16 training and 9 validation images of
  40-80 px; 2 epochs of 4 steps with ckpt-4, ckpt-8 and an export; the
  class count comes from the data; an eval crop of half the short side.
  """
  from tests import imagenet_fixture  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('records_run')
  data_dir, model_dir = root / 'data', root / 'model'
  imagenet_fixture.write_dataset(str(data_dir), num_classes=len(CLASS_NAMES),
                                 train_per_shard=(8, 8), eval_per_shard=(5, 4))
  (data_dir / 'labels.txt').write_text(''.join(f'{n}\n' for n in CLASS_NAMES))
  args = [a for a in e2e.TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes', '--num_eval_examples',
       '--batch_size'))]
  e2e.train_tiny(model_dir, args + ['--batch_size=4', f'--data_dir={data_dir}',
                                    '--eval_crop_fraction=0.5'])
  return str(data_dir), str(model_dir)
