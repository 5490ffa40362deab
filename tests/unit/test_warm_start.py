"""--restore_from, --restore_optimizer, --pretrained_checkpoint,
--freeze_backbone: which combinations a config accepts. (Warm starts from
trained runs: e2e/.)"""

import pytest

from resnet_keras.config import RunConfig
from common.errors import UsageError


def test_flag_combinations_are_checked():
  for changes, message in (
      (dict(restore_from='a', pretrained_checkpoint='b'), 'use one'),
      (dict(restore_optimizer=True), 'give --restore_from'),
      (dict(freeze_backbone=True), 'give --pretrained_checkpoint')):
    with pytest.raises(UsageError, match=message):
      RunConfig(**changes).check()
