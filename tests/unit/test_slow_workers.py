"""A slow worker named (resnet_keras/training/slow_workers.py): the rule against
hand-computed values, its log lines and summary, and the time it compares,
each worker's own part of a step, measured in a real training loop."""

import logging
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.training import slow_workers
from resnet_keras.engine.metrics import LOOP_RECORD, LoopRecord
from tests.support import loops


def _loops(*times, seconds=10.0):
  return [(seconds, 1 + 10 * i, t) for i, t in enumerate(times)]


@pytest.mark.parametrize('times, slow', [
    # 25% over the others' 1.0 s in each of the last 30 s of loops.
    ([[1.0, 1.0, 1.25]] * 3, {2: 0.25}),
    # The median loop of the three counts: 25%, with one at 5%...
    ([[1.0, 1.0, 1.25], [1.0, 1.0, 1.05], [1.0, 1.0, 1.3]], {2: 0.25}),
    # ...not a single loop's pause: 5% in two of three.
    ([[1.0, 1.0, 1.05], [1.0, 1.0, 4.0], [1.0, 1.0, 1.05]], {}),
    # An older loop beyond the 30 s does not count.
    ([[1.0, 1.0, 1.0]] + [[1.0, 1.0, 1.25]] * 3, {2: 0.25}),
    ([[1.0, 1.0, 1.25]] * 2, {}),  # 20 s: too short to say.
    ([[1.0, 1.12]] * 3, {1: 0.12}),  # Two workers: against the other one.
    ([[1.0, 1.09]] * 3, {}),  # 9%: within the margin.
    # The median of the others, not their mean: each of two slow ones.
    ([[1.0, 1.0, 2.0, 1.3]] * 3, {2: 1.0, 3: 0.3}),
])
def test_a_worker_is_slow_by_10_percent_over_the_others_for_30_s(times, slow):
  assert slow_workers.slow_workers(_loops(*times)) == pytest.approx(slow)


def _output(first_step, own, seconds=10.0, steps=10):
  return {LOOP_RECORD: LoopRecord(
      first_step=first_step, losses=np.zeros(steps),
      accuracies=np.zeros(steps), seconds=seconds,
      own_step_seconds=np.array(own))}


def test_the_chief_names_a_slow_worker_once_and_says_when_it_recovers(
    caplog):
  # On absl's logger itself: an earlier test in this worker may have left
  # its level at WARNING (absl's verbosity), which the root's level does not
  # override.
  caplog.set_level(logging.INFO, logger='absl')
  follow = slow_workers.SlowWorkers(log=True)
  times = [[0.1, 0.1, 0.1]] * 2 + [[0.1, 0.1, 0.15]] * 5 + [[0.1] * 3] * 2
  for i, own in enumerate(times):
    follow(_output(1 + 10 * i, own))
  said = [r.getMessage() for r in caplog.records]
  assert said == [
      'worker 2 is slow: its own part of each step (input and forward pass) '
      'took 50% longer than the other workers\' median over the last 30 s '
      'of training (steps 11 to 40); every step waits for it',
      'worker 2 is no longer slow (step 90)']
  summary = follow.summary()
  # Named once two of the last three loops were slow, and until two were
  # not.
  assert summary['slow_workers'] == [{'worker': 2, 'from_step': 11,
                                      'to_step': 80, 'over_median': 0.5}]
  # Over the 90 steps: 5 of 9 loops at 0.15 s.
  assert summary['own_step_seconds'] == pytest.approx(
      [0.1, 0.1, (4 * 0.1 + 5 * 0.15) / 9], abs=1e-5)
  # A job of one worker has no others to be slower than.
  alone = slow_workers.SlowWorkers(log=True)
  alone(_output(1, [0.2]))
  assert alone.summary() == {'own_step_seconds': [0.2], 'slow_workers': []}


def test_own_time_is_the_steps_forward_pass_not_its_wait_before_it():
  """A forward pass that sleeps 30 ms and a stop poll, before each step,
  that sleeps 60 ms (as a worker waits there on a slower one): the own
  time per step holds the first and not the second."""

  def slow_zero():
    time.sleep(0.03)
    return np.float32(0)

  model = tf_keras.Sequential([
      tf_keras.layers.Lambda(
          lambda x: x + tf.ensure_shape(
              tf.py_function(slow_zero, [], tf.float32), []),
          input_shape=(8, 8, 3)),
      tf_keras.layers.Conv2D(4, 3), tf_keras.layers.GlobalAveragePooling2D(),
      tf_keras.layers.Dense(5, activation='softmax')])
  data = tf.data.Dataset.from_tensors(
      (tf.zeros([4, 8, 8, 3]), tf.zeros([4], tf.int64))).repeat()
  trainer = loops.trainer(model, tf_keras.optimizers.legacy.SGD(0.1), data,
                          4, steps_per_loop=5,
                          stop_requested=lambda: time.sleep(0.06) or False)
  trainer.train(tf.constant(5))  # Tracing.
  loop = trainer.train(tf.constant(5))[LOOP_RECORD]
  own, = loop.own_step_seconds
  assert 0.03 <= own < 0.06
  assert loop.own_seconds == pytest.approx(5 * own, rel=1e-5)
  assert loop.seconds > 5 * (own + 0.06)
