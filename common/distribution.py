"""Distribution backends: which tf.distribute strategy a run uses.

The training loop asks the strategy for replicas, scopes and reductions; it
never branches on the backend. `--batch_size` is the global batch under
tf.distribute (one program drives every replica), as in the reference.
"""

from absl import logging
import tensorflow as tf
from official.common import distribute_utils

from resnet_keras.errors import UsageError


def build_strategy(name: str, num_gpus: int = -1) -> tf.distribute.Strategy:
  """The strategy `--distribution_strategy` names (off: the default one)."""
  if name == 'hpu':
    raise UsageError('--distribution_strategy=hpu is Gaudi-only; use mirrored '
                     '(one host) or multi_worker_mirrored (several hosts)')
  gpus = len(tf.config.list_physical_devices('GPU'))
  if num_gpus < 0:
    num_gpus = gpus
  if num_gpus > gpus:
    raise UsageError(f'--num_gpus={num_gpus} but only {gpus} GPU(s) are '
                     'visible; lower --num_gpus')
  strategy = distribute_utils.get_distribution_strategy(
      distribution_strategy=name, num_gpus=num_gpus)
  strategy = strategy or tf.distribute.get_strategy()
  logging.info('distribution: %s, %d replica(s) in sync', name,
               strategy.num_replicas_in_sync)
  return strategy
