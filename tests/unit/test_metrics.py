"""Log lines per --log_steps from loop records; steady-state throughput."""

import json

import numpy as np
import pytest
from absl import logging

from resnet_keras import files
from resnet_keras.engine import metrics
from common.errors import UsageError
from resnet_keras.engine.metrics import LOOP_RECORD, LoopRecord


def test_log_lines_every_log_steps_within_and_across_loops(monkeypatch,
                                                          tmp_path):
  lines = []
  monkeypatch.setattr(logging, 'info', lambda msg, *a: lines.append(msg % a
                                                                    if a else msg))
  loops = [LoopRecord(1, np.array([4., 3., 2.]), np.array([0., .5, 1.]), 10.0),
           LoopRecord(4, np.array([1., 1., 1.]), np.array([1., 1., 1.]), 1.0)]
  log = metrics.MetricsLog(str(tmp_path))
  logger = metrics.StepLogger(
      log_steps=2, total_steps=6,
      steps_per_epoch=3, global_batch_size=10,
      learning_rate_at=lambda step: 0.1 * step, progress_bar=False,
      metrics_log=log)
  for loop in loops:
    logger({LOOP_RECORD: loop})
  assert len(lines) == 3                     # steps 2, 4, 6
  assert lines[0].startswith('step 2/6 | epoch 0.67 | loss 3.5000 | '
                             'accuracy 0.2500 | lr 0.2 |')
  assert '3.0 examples/sec' in lines[0]      # 3 steps x 10 images / 10 s
  assert 'step 4/6' in lines[1] and 'loss 1.5000' in lines[1]  # 2 and 1
  assert 'step 6/6' in lines[2] and '30.0 examples/sec' in lines[2]
  assert logger.average_examples_per_second == 30.0   # first loop excluded
  assert logger.last_loss == 1.0
  # metrics.jsonl has a record per line, with the values the line shows.
  records = metrics.read_metrics_log(str(tmp_path))
  assert [r['step'] for r in records] == [2, 4, 6]
  assert records[0] == {'step': 2, 'epoch': 2 / 3, 'train_loss': 3.5,
                        'train_accuracy': 0.25,
                        'learning_rate': 0.2, 'examples_per_second': 3.0}


def test_single_loop_throughput_uses_it():
  logger = metrics.StepLogger(
      log_steps=100, total_steps=2, steps_per_epoch=2, global_batch_size=8,
      learning_rate_at=lambda s: 0.0, progress_bar=False)
  logger({LOOP_RECORD: LoopRecord(1, np.ones(2), np.ones(2), 4.0)})
  assert logger.average_examples_per_second == 4.0


def test_write_json_atomically(tmp_path):
  path = tmp_path / 'summary.json'
  files.write_json_atomically(str(path), {'a': 1})
  assert json.loads(path.read_text()) == {'a': 1}
  assert not (tmp_path / 'summary.json.tmp').exists()


def test_warns_once_when_steps_wait_for_input(monkeypatch):
  warnings, lines = [], []
  monkeypatch.setattr(logging, 'warning',
                      lambda msg, *a: warnings.append(msg % a))
  monkeypatch.setattr(logging, 'info',
                      lambda msg, *a: lines.append(msg % a if a else msg))
  loops = ([
      LoopRecord(1, np.ones(2), np.ones(2), 10.0, input_wait_seconds=9.0),
      LoopRecord(3, np.ones(2), np.ones(2), 2.0, input_wait_seconds=0.2),
      LoopRecord(5, np.ones(2), np.ones(2), 2.0, input_wait_seconds=1.0),
      LoopRecord(7, np.ones(2), np.ones(2), 2.0, input_wait_seconds=1.5)])
  logger = metrics.StepLogger(
      log_steps=2, total_steps=8,
      steps_per_epoch=8, global_batch_size=4,
      learning_rate_at=lambda s: 0.0, progress_bar=False)
  for loop in loops:
    logger({LOOP_RECORD: loop})
  # Every line says how much of its loop waited for input.
  assert [l.split(' | ')[-1] for l in lines] == [
      'input wait 90%', 'input wait 10%', 'input wait 50%', 'input wait 75%']
  # The first loop (pipeline start-up) is not judged; 10% is fine; 50% warns
  # once, naming the steps and what to try; 75% does not repeat it.
  assert len(warnings) == 1
  assert warnings[0].startswith('input-bound: steps 5-6 waited for their '
                                'batches 50% of the time; try ')
  assert logger.input_wait_fraction == (0.2 + 1.0 + 1.5) / 6.0


def test_metrics_log_resumes_at_a_step_and_tolerates_a_torn_end(tmp_path):
  log = metrics.MetricsLog(str(tmp_path))
  for step in (2, 4, 6):
    log.append({'step': step, 'train_loss': float(step)})
  with open(log.path, 'a') as f:
    f.write('{"step": 8, "train_lo')           # killed mid-append
  assert [r['step'] for r in metrics.read_metrics_log(str(tmp_path))] == [
      2, 4, 6]
  log.resume_at(4)                              # the checkpoint's step
  log.append({'step': 6, 'train_loss': -1.0})
  assert metrics.read_metrics_log(str(tmp_path)) == [
      {'step': 2, 'train_loss': 2.0}, {'step': 4, 'train_loss': 4.0},
      {'step': 6, 'train_loss': -1.0}]


def test_a_torn_line_in_the_middle_is_an_error(tmp_path):
  (tmp_path / 'metrics.jsonl').write_text('{"step": 2}\n{"st\n{"step": 4}\n')
  with pytest.raises(UsageError, match='line 2 is not JSON'):
    metrics.read_metrics_log(str(tmp_path))


def test_fp16_log_lines_and_records_carry_the_loss_scale(monkeypatch,
                                                          tmp_path):
  lines = []
  monkeypatch.setattr(logging, 'info', lambda msg, *a: lines.append(msg % a
                                                                    if a else msg))
  log = metrics.MetricsLog(str(tmp_path))
  loop = LoopRecord(1, np.ones(2), np.ones(2), 4.0,
                    loss_scales=np.array([32768.0, 16384.0]))
  logger = metrics.StepLogger(
      log_steps=1, total_steps=2, steps_per_epoch=2,
      global_batch_size=8, learning_rate_at=lambda step: 0.1,
      progress_bar=False, metrics_log=log)
  logger({LOOP_RECORD: loop})
  records = metrics.read_metrics_log(str(tmp_path))
  assert [r['loss_scale'] for r in records] == [32768.0, 16384.0]
  assert '| lr 0.1 | loss scale 16384 | 4.0 examples/sec' in lines[-1]
  assert 'loss scale' not in metrics.format_step_line(1, 2, 0.5, 1.0, 1.0,
                                                      0.1, 10.0)
