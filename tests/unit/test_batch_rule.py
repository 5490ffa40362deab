"""--batch_size's one rule: per worker under Horovod, global under
tf.distribute (common/batch_rule.py)."""

import pytest

from common.batch_rule import BatchRule
from common.errors import UsageError


def test_horovod_takes_the_batch_per_worker():
  rule = BatchRule(workers=4, horovod=True)
  assert rule.programs == 4
  assert (rule.global_batch(32), rule.worker_batch(32)) == (128, 32)
  assert rule.batch_size(32) == 32
  rule.check(7)  # Any per-worker batch splits.


def test_tf_distribute_takes_the_global_batch():
  rule = BatchRule(workers=4, horovod=False)
  assert rule.programs == 1
  assert (rule.global_batch(128), rule.worker_batch(128)) == (128, 32)
  assert rule.batch_size(32) == 128


@pytest.mark.parametrize('horovod', [True, False])
def test_the_flag_for_a_worker_batch_reads_back_as_that_batch(horovod):
  rule = BatchRule(workers=3, horovod=horovod)
  assert rule.worker_batch(rule.batch_size(16)) == 16


def test_a_global_batch_that_does_not_split_is_one_line():
  with pytest.raises(UsageError, match=r'^--batch_size=10 is the global batch '
                     r'under tf.distribute and must be a multiple of the 4 '
                     r'workers; use e.g. --batch_size=8$'):
    BatchRule(workers=4, horovod=False).check(10)
