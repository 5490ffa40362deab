"""The goodput arithmetic (resnet_keras/training/goodput.py) against
hand-computed values, and an attempt's record as the chief writes it."""

import json
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.engine import distribution
from resnet_keras.training import goodput
from resnet_keras.rundir import run_directory
from resnet_keras.engine.metrics import LOOP_RECORD, LoopRecord
from tests.support import loops


def _attempt(**fields):
  record = {'process_start': 0.0, 'ready': 0.0, 'end': 0.0, 'start_step': 0,
            'last_step': 0, 'first_loop': [0, 0.0], 'loops': [0, 0.0],
            'training': 0.0, 'checkpoints': 0.0, 'evaluation': 0.0,
            'export': 0.0}
  record.update(fields)
  return record


# Killed at step 10 (its last record), two steps after its checkpoint at 8:
# start-up 10 s, then 15 s of training calls whose first loop of 2 steps
# took 6 s where later steps take 1 s (4 s of tracing), a 3 s checkpoint,
# 10 s of evaluation and 1 s of nothing named.
FIRST = _attempt(process_start=100.0, ready=110.0, end=139.0, last_step=10,
                 first_loop=[2, 6.0], loops=[10, 14.0], training=15.0,
                 checkpoints=3.0, evaluation=10.0)
# Started 11 s later, resumed from step 8 and trained to 20 (steps 9 and 10
# again): start-up 12 s, 15 s of training calls of which 3 s the first
# loop's tracing, so 1 s a step; 2 s of checkpoints, 4 of evaluation, 3 of
# export, 1 of nothing named.
SECOND = _attempt(process_start=150.0, ready=162.0, end=187.0, start_step=8,
                  last_step=20, first_loop=[2, 5.0], loops=[12, 15.0],
                  training=15.0, checkpoints=2.0, evaluation=4.0, export=3.0)


def test_the_first_loop_beyond_the_later_loops_pace_is_start_up():
  # Later loops: 6 steps in 0.3 s; the first loop's 2 steps would take 0.1.
  assert goodput.first_loop_excess((2, 2.2), (8, 2.5)) == pytest.approx(2.1)
  assert goodput.first_loop_excess((2, 2.2), (2, 2.2)) == 0  # no later loop
  assert goodput.first_loop_excess((0, 0.0), (0, 0.0)) == 0
  # A first loop no slower than the rest holds no start-up.
  assert goodput.first_loop_excess((2, 0.1), (6, 0.6)) == 0


@pytest.mark.parametrize('earlier_last, start, last, redone', [
    (10, 8, 20, 2),   # resumed two steps before the earlier attempt's last
    (10, 8, 9, 1),    # and stopped again before reaching it
    (10, 10, 20, 0),  # resumed where the earlier one stopped
    (0, 0, 8, 0),     # the first attempt
    (0, 4, 8, 0)])    # a run whose earlier attempts were never recorded
def test_redone_steps(earlier_last, start, last, redone):
  assert goodput.redone_steps(earlier_last, start, last) == redone


def test_two_attempts_with_a_redone_stretch_and_a_wait_between():
  block = goodput.split([FIRST, SECOND])
  assert block['wall_seconds'] == 87  # 100 s to 187 s
  assert block['attempts'] == 2 and block['redone_steps'] == 2
  assert block['seconds'] == pytest.approx({
      'productive': 11 + 10,  # 15 - 4 of tracing; 15 - 3 less 2 steps of 1 s
      'redone': 2, 'stalled': 0, 'startup': (10 + 4) + (12 + 3),
      'checkpoints': 5, 'evaluation': 14, 'export': 3,
      'waiting': 150 - 139, 'other': 2})
  assert sum(block['seconds'].values()) == pytest.approx(87)
  assert block['goodput'] == pytest.approx(21 / 87, abs=1e-4)
  # Each over its stretch: 100-139 s; 139-187 s, the wait before it in.
  assert block['per_attempt'] == [round(11 / 39, 4), round(10 / 48, 4)]
  assert goodput.sentence(block) == (
      'goodput 24%: 21 s of 87 s wall in productive steps; start-up 29 s '
      '(2 attempts), redone 2.0 s (2 steps), stalled 0.0 s, checkpoints '
      '5.0 s, evaluation 14 s, export 3.0 s, waiting 11 s, other 2.0 s')


def test_a_stall_is_neither_productive_nor_redone():
  # SECOND stalled 3 s of its 15: its 12 steps took 15 - 3 - 3 = 9 s, 0.75 s
  # each, so its 2 redone steps 1.5 s; 7.5 s productive.
  block = goodput.split([FIRST, dict(SECOND, stalled=3.0)])
  seconds = block['seconds']
  assert seconds['stalled'] == 3
  assert seconds['redone'] == pytest.approx(1.5)
  assert seconds['productive'] == pytest.approx(11 + 7.5)
  assert seconds['startup'] == 29 and seconds['other'] == pytest.approx(2)
  # A stall is never more than the training calls it was part of.
  assert goodput.split([dict(FIRST, stalled=99.0)])['seconds']['stalled'] \
      == 15 - 4


@pytest.mark.parametrize('interval, earlier, stalled', [
    (2.1, [0.1] * 5, 2.0),  # 2 s beyond steps of 0.1 s.
    (0.5, [0.1] * 5, 0.0),  # 5 x the usual, but 0.4 s: a loop's end.
    (2.1, [0.1] * 4, 0.0),  # Too few steps to know the usual.
    (3.9, [2.0] * 9, 0.0),  # Steps of 2 s: under 2 x.
    (4.6, [2.0, 2.0, 9.0, 2.0, 2.0], 2.6),  # The median, not the mean.
])
def test_a_step_stalls_by_its_time_beyond_the_usual(interval, earlier,
                                                    stalled):
  assert goodput.stalled_seconds(interval, earlier) == pytest.approx(stalled)


def test_steps_redone_count_against_every_earlier_attempt():
  # A third attempt resumes from step 8 again after the second one, which
  # also resumed there, stopped at step 9: steps 9 and 10 were trained by
  # the first.
  second = _attempt(process_start=140.0, ready=141.0, end=142.0,
                    start_step=8, last_step=9, loops=[1, 1.0], training=1.0)
  third = _attempt(process_start=143.0, ready=144.0, end=150.0, start_step=8,
                   last_step=12, loops=[4, 4.0], training=4.0)
  block = goodput.split([FIRST, second, third])
  assert block['redone_steps'] == 1 + 2
  assert block['seconds']['redone'] == pytest.approx(1.0 + 2.0)
  assert block['seconds']['waiting'] == pytest.approx(1.0 + 1.0)


def test_a_clock_behind_the_last_attempts_leaves_its_gap_in_other():
  behind = dict(SECOND, process_start=135.0, ready=147.0, end=172.0)
  block = goodput.split([FIRST, behind])
  assert block['seconds']['waiting'] == 0
  assert sum(block['seconds'].values()) == pytest.approx(72)


def test_one_attempt_says_so_in_the_singular():
  block = goodput.split([_attempt(process_start=0.0, ready=5.0, end=9.0,
                                  last_step=4, loops=[4, 4.0],
                                  training=4.0)])
  assert goodput.sentence(block).startswith(
      'goodput 44%: 4.0 s of 9.0 s wall in productive steps; start-up 5.0 s '
      '(1 attempt), redone 0.0 s (0 steps), stalled 0.0 s')


def _loop(first_step, steps, seconds):
  return {LOOP_RECORD: LoopRecord(first_step=first_step,
                                  losses=np.zeros(steps),
                                  accuracies=np.zeros(steps),
                                  seconds=seconds)}


def test_each_attempt_is_written_after_the_earlier_ones(tmp_path,
                                                       monkeypatch):
  path = tmp_path / run_directory.GOODPUT_FILE
  first = goodput.Attempt(str(tmp_path), 1000.0, 0)
  first.ready()
  with first.timing('checkpoints'):
    pass
  first(_loop(1, 2, 0.5))
  first(_loop(3, 0, 0.01))  # A loop a stop ended before its first step.
  first(_loop(3, 2, 0.25))
  # Loops alone write no more often than WRITE_EVERY seconds.
  assert json.loads(path.read_text())[0]['last_step'] == 0
  monkeypatch.setattr(goodput, 'WRITE_EVERY', 0.0)
  first(_loop(5, 2, 0.25))
  written, = json.loads(path.read_text())
  assert written['last_step'] == 6 and written['start_step'] == 0
  assert written['first_loop'] == [2, 0.5] and written['loops'] == [6, 1.0]
  assert written['process_start'] == 1000.0
  assert 1000.0 < written['ready'] <= written['end']
  assert written['checkpoints'] >= 0

  second = goodput.Attempt(str(tmp_path), written['end'] + 1, 4)
  second.ready()
  records = json.loads(path.read_text())
  assert [r['start_step'] for r in records] == [0, 4]
  block = second.job()
  assert block['attempts'] == 2 and block['redone_steps'] == 0
  assert sum(block['seconds'].values()) == pytest.approx(
      block['wall_seconds'], abs=0.01)

  # Another worker's account is its own; only the chief's is written.
  goodput.Attempt(None, 0.0, 0).ready()
  assert len(json.loads(path.read_text())) == 2


def test_a_write_inside_a_phase_counts_it_to_then(tmp_path):
  """A chief killed in a training call of many loops keeps their time: the
  write after a loop holds the call's time so far."""
  attempt = goodput.Attempt(str(tmp_path), time.time(), 0)
  with attempt.timing('training'):
    begun = time.monotonic()
    time.sleep(0.2)
    attempt.write()
    so_far = time.monotonic() - begun
  written, = json.loads((tmp_path / run_directory.GOODPUT_FILE).read_text())
  assert 0.2 <= written['training'] <= so_far
  assert attempt.record['training'] >= so_far  # The block, once, at its end.


def test_a_step_that_sleeps_is_stalled_by_its_sleep_on_the_monotonic_clock():
  """A tiny model's training loops, one of whose steps waits 0.8 s before
  it begins (in the stop poll, as a step waits on a frozen peer): the
  account's stall is that wait, timed outside it, and the other steps stay
  productive."""
  tf_keras.utils.set_random_seed(1)
  model = tf_keras.Sequential([
      tf_keras.layers.Conv2D(4, 3, input_shape=(8, 8, 3)),
      tf_keras.layers.GlobalAveragePooling2D(),
      tf_keras.layers.Dense(5, activation='softmax')])
  data = tf.data.Dataset.from_tensors(
      (tf.zeros([4, 8, 8, 3]), tf.zeros([4], tf.int64))).repeat()
  polls, slept = [], []

  def stop_requested():
    polls.append(None)
    if len(polls) == 25:
      begun = time.monotonic()
      time.sleep(0.8)
      slept.append(time.monotonic() - begun)
    return False

  progress = distribution.Progress(stall=goodput.stalled_seconds)
  trainer = loops.trainer(model, tf_keras.optimizers.legacy.SGD(0.1), data,
                          4, steps_per_loop=10, progress=progress,
                          stop_requested=stop_requested)
  attempt = goodput.Attempt(None, time.time(), 0,
                            stalled=lambda: progress.stalled('training'))
  attempt.ready()
  with attempt.timing('training'), progress.waiting('training'):
    for _ in range(4):
      attempt(trainer.train(tf.constant(10)))
  block = attempt.job()
  assert len(polls) == 40 and len(slept) == 1
  assert block['seconds']['stalled'] == pytest.approx(slept[0], abs=0.15)
  # The loops' own clock (StepRecord's) held the sleep; productive not.
  assert block['seconds']['productive'] <= (
      attempt.record['loops'][1] - slept[0] + 0.15)
