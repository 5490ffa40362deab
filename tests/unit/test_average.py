"""resnet_keras/tools/checkpoint_average.py: the mean and EMA of weight lists,
which checkpoints and decays python -m resnet_keras.average accepts."""

import numpy as np
import pytest

from resnet_keras.tools import checkpoint_average
from common.errors import UsageError


def test_mean_and_ema_of_weight_lists():
  sets = [[np.array([0., 4.]), np.array(2.)], [np.array([2., 0.]),
                                               np.array(4.)],
          [np.array([4., 2.]), np.array(0.)]]
  mean = checkpoint_average.average_weights(iter(sets))
  np.testing.assert_allclose(mean[0], [2., 2.])
  np.testing.assert_allclose(mean[1], 2.)
  # EMA 0.5, oldest first: 0 -> 0.5*0+0.5*2 = 1 -> 0.5*1+0.5*4 = 2.5.
  ema = checkpoint_average.average_weights(iter(sets), ema_decay=0.5)
  np.testing.assert_allclose(ema[0], [2.5, 2.])
  np.testing.assert_allclose(ema[1], 1.5)
  assert checkpoint_average.average_weights([sets[0]])[0].tolist() == [0., 4.]


def test_selection_and_decay_checks():
  kept = ['/d/ckpt-4', '/d/ckpt-8', '/d/ckpt-12']
  assert checkpoint_average.select_last(kept, None, '/d') == kept
  assert checkpoint_average.select_last(kept, 2, '/d') == kept[1:]
  with pytest.raises(UsageError, match=r'--last=4: /d keeps 3 checkpoints '
                     r'\(ckpt-4, ckpt-8, ckpt-12\); use 1 to 3'):
    checkpoint_average.select_last(kept, 4, '/d')
  with pytest.raises(UsageError, match='--last=0'):
    checkpoint_average.select_last(kept, 0, '/d')
  for decay in (0.0, 1.0, 1.5, -0.1):
    with pytest.raises(UsageError, match='--ema=.* fraction in'):
      checkpoint_average.check_ema_decay(decay)
  checkpoint_average.check_ema_decay(0.9)
  checkpoint_average.check_ema_decay(None)
  with pytest.raises(UsageError, match='is the run\'s model_dir'):
    checkpoint_average.output_dir_for('/d', '/d/')
  assert checkpoint_average.output_dir_for('/d', None) == '/d/averaged'
