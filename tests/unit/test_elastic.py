"""Elastic jobs' arithmetic: the batch split on fewer hosts, the checks made
before anything runs, the one line of a change; and the record of the job's
shapes (resnet_keras/engine/world.py) that says where a resumed run's data
goes on."""

import json

import pytest

from resnet_keras.launcher import elastic
from common.errors import UsageError
from resnet_keras.rundir import run_directory
from resnet_keras.engine import world

HOSTS = ('h1', 'h2', 'h3')


def test_keep_splits_the_planned_global_batch_in_micro_batches_no_larger():
  # 3 Horovod workers x 8 in 2 micro-batches of 4: G = 24.
  planned = elastic.planned_layout(HOSTS, 1, 8, 2, horovod=True)
  assert (planned.global_batch, planned.lr_scale) == (24, 1)
  two = elastic.relayout(planned, HOSTS[:2], 1, elastic.KEEP)
  # 24 / 2 = 12 per worker: micro-batches of 4 need 3 of them.
  assert (two.workers, two.worker_batch, two.micro_batches) == (2, 12, 3)
  assert two.global_batch == 24 and two.lr_scale == 1
  assert two.trainer_flags(horovod=True) == ['--batch_size=12',
                                             '--num_accumulation_steps=3']
  assert two.trainer_flags(horovod=False) == ['--batch_size=24',
                                              '--num_accumulation_steps=3']
  one = elastic.relayout(planned, HOSTS[:1], 1, elastic.KEEP)
  assert (one.worker_batch, one.micro_batches) == (24, 6)


def test_keep_has_no_split_when_the_workers_do_not_divide_the_batch():
  planned = elastic.planned_layout(HOSTS, 1, 3, 1, horovod=True)  # G = 9
  assert elastic.relayout(planned, HOSTS[:2], 1, elastic.KEEP) is None
  with pytest.raises(UsageError, match=(
      r'^the global batch of 9 cannot be split evenly over the workers of 2 '
      r'host\(s\), which --min_hosts=2 allows; host counts that keep it: 1, '
      r'3: .*--elastic_batch=scale')):
    elastic.check_host_counts(planned, 2, 1, elastic.KEEP)
  elastic.check_host_counts(planned, 3, 1, elastic.KEEP)  # Nothing to shrink.
  elastic.check_host_counts(planned, 2, 1, elastic.SCALE)


def test_scale_keeps_each_workers_batch_and_scales_the_learning_rate():
  # tf.distribute: --batch_size 12 is global over 3 hosts x 2 workers.
  planned = elastic.planned_layout(HOSTS, 2, 12, 1, horovod=False)
  assert (planned.workers, planned.worker_batch) == (6, 2)
  two = elastic.relayout(planned, HOSTS[:2], 2, elastic.SCALE)
  assert (two.workers, two.worker_batch, two.global_batch) == (4, 2, 8)
  assert two.lr_scale == pytest.approx(8 / 12)
  assert two.trainer_flags(horovod=False) == [
      '--batch_size=8', '--num_accumulation_steps=1',
      '--planned_global_batch=12']


def test_a_change_is_one_line_with_what_a_user_needs():
  planned = elastic.planned_layout(HOSTS, 1, 8, 1, horovod=True)
  two = elastic.relayout(planned, ('h1', 'h3'), 1, elastic.KEEP)
  line = elastic.describe_change(planned, two, step=32, lost_seconds=41.4)
  assert line == ('elastic: the job shrinks from 3 to 2 host(s) (h1, h3): 2 '
                  'host(s), 2 worker(s) x batch 12 in 2 micro-batch(es) = '
                  'global batch 24 (kept); resuming at step 32; 41 s lost')
  assert 'the job grows from 2 to 3' in elastic.describe_change(
      two, planned, step=None, lost_seconds=0)


def test_the_world_record_counts_the_examples_each_shape_read(tmp_path):
  model_dir = str(tmp_path)
  three = {'workers': 3, 'global_batch_size': 24, 'worker_batch_size': 8,
           'micro_batches': 1, 'lr_scale': 1.0, 'hosts': ['a', 'b', 'c']}
  assert world.examples_read(world.read(model_dir), 10) is None
  world.record(model_dir, {**three, 'step': 0})
  world.record(model_dir, {**three, 'step': 4, 'hosts': ['c', 'b', 'a']})
  assert len(world.read(model_dir)) == 1  # The same shape goes on.
  scaled = {**three, 'workers': 2, 'global_batch_size': 16, 'lr_scale': 2 / 3}
  world.record(model_dir, {**scaled, 'step': 10})
  history = world.read(model_dir)
  assert [entry['step'] for entry in history] == [0, 10]
  # 10 steps of 24, then 5 of 16.
  assert world.examples_read(history, 15) == 10 * 24 + 5 * 16
  assert world.examples_read(history, 6) == 6 * 24
  # An attempt resuming at step 8 redoes steps 8-10: the later shape goes.
  world.record(model_dir, {**three, 'step': 8, 'workers': 1})
  assert [(e['step'], e['workers']) for e in world.read(model_dir)] == [
      (0, 3), (8, 1)]
  assert json.loads((tmp_path / run_directory.WORLD_FILE).read_text())[1]['step'] == 8
