"""What the tf.data service tests share (resnet_keras/data/input_service.py):
a tiny run reading from a service (free ports: testbed/ports.py)."""

from resnet_keras.config import RunConfig
from tests.support import runner


def service_config(model_dir, records_dir, address, **overrides) -> RunConfig:
  """The tiny recipe on `records_dir`'s records through the service at
  `address`: 2 steps of 4 images, a log record every step, seed 1; the
  class and example counts come from the data."""
  return runner.tiny_config(model_dir, **{
      'batch_size': 4, 'train_steps': 2, 'log_steps': 1, 'global_seed': 1,
      'use_synthetic_data': False, 'data_dir': records_dir,
      'num_classes': 0, 'num_eval_examples': 0,
      'tf_data_service': address, 'tf_data_service_timeout': 60,
      **overrides})
