"""Runs that stop or resume losing nothing, through the trainer's main in
this process: non-finite losses, checkpoint intervals, foreign checkpoints,
a full disk, a checkpoint cut short, resumes and seeds that give the same weights. (Signals and
kill -9, to a process of its own: processes/; the guard alone: unit/.)"""

import glob
import json
import logging as py_logging
import os
import re
import shutil
import subprocess
import time

from absl import logging
import pytest

from common import worker_contract
from resnet_keras.training import goodput
from resnet_keras.engine import guards
from resnet_keras.rundir import run_directory
from tests.support import runner
from tests.support.records import write_dataset


def _copy_of(synthetic_run, tmp_path):
  """A copy of the shared tiny run (ckpt-4, ckpt-8, its record of what it
  wrote): a run with checkpoints to go on from or to refuse."""
  model_dir = str(tmp_path / 'model')
  shutil.copytree(synthetic_run, model_dir)
  return model_dir


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(synthetic_run,
                                                             tmp_path):
  model_dir = _copy_of(synthetic_run, tmp_path)
  assert runner.checkpoint_steps(model_dir) == [4, 8]
  exploding = runner.run_main([f'--model_dir={model_dir}', '-te', '3',
                               '--enable_checkpoint_and_export', '--skip_eval',
                               '--base_learning_rate=1e30',
                               '--warmup_epochs=0'] + runner.TINY)
  runner.assert_stopped_with(exploding, 'training loss is', 'at step',
                            'ckpt-8', '--base_learning_rate')
  assert exploding.returncode == guards.NON_FINITE_EXIT_CODE
  assert runner.checkpoint_steps(model_dir) == [4, 8]


class _LastWriteOutlastsTheExport(py_logging.Filter):
  """Holds the writer's thread at the line of the last checkpoint's write
  (its files complete, before the manager names it in the state file)
  until 2 s after the run's export is in place."""

  def __init__(self, model_dir):
    super().__init__()
    self._export = os.path.join(model_dir, run_directory.SAVED_MODEL_DIR)

  def filter(self, record):
    if record.getMessage().startswith('saved checkpoint at step 8 '):
      deadline = time.time() + 120
      while not os.path.exists(self._export) and time.time() < deadline:
        time.sleep(0.05)  # Polls for the export's folder.
      time.sleep(2)
    return True


def test_checkpoint_interval_and_max_checkpoints(tmp_path):
  """The run's end waits for the last write (as checkpoint time): its
  checkpoint is the state file's latest when the run returns."""
  model_dir = str(tmp_path / 'model')
  slow = _LastWriteOutlastsTheExport(model_dir)
  logging.get_absl_logger().addFilter(slow)
  try:
    result = runner.run_main([f'--model_dir={model_dir}', '-te', '2',
                              '--enable_checkpoint_and_export', '--skip_eval',
                              '--checkpoint_interval_steps=1',
                              '--steps_per_loop=1', '--max_checkpoints=3'] +
                             runner.TINY[:-3])
  finally:
    logging.get_absl_logger().removeFilter(slow)
  assert result.returncode == 0, result.stderr[-3000:]
  saved = re.findall(r'saved checkpoint at step (\d+) \(\S+\): training '
                     r'blocked [\d.]+ s, written in [\d.]+ s in the '
                     'background', result.stderr)
  assert saved == [str(step) for step in range(1, 9)]  # every step of 2x4
  assert run_directory.latest_checkpoint(model_dir).step == 8
  assert runner.checkpoint_steps(model_dir) == [6, 7, 8]
  job = runner.read_summary(model_dir)['goodput']
  assert job['seconds']['checkpoints'] > 1.5  # The end's wait, 2 s held.
  assert job['checkpoint_writes_seconds'] > 0


def test_checkpoints_by_time_come_at_loop_ends_once_the_interval_passed(
    tmp_path):
  """An interval shorter than a loop: a save at every loop end after the
  first (which traced), each said "(by time)"; the end's checkpoint, saved
  by time, is not written again."""
  model_dir = str(tmp_path / 'model')
  result = runner.run_main(
      [f'--model_dir={model_dir}', '--enable_checkpoint_and_export',
       '--skip_eval', '--checkpoint_interval_seconds=0.001',
       '--train_steps=6'] +
      [a for a in runner.TINY if not a.startswith('--train_steps')])
  assert result.returncode == 0, result.stderr[-3000:]
  saved = re.findall(r'saved checkpoint at step (\d+)( \(by time\))?',
                     result.stderr)
  assert saved == [('4', ' (by time)'), ('6', ' (by time)')]
  assert runner.checkpoint_steps(model_dir) == [4, 6]


def test_checkpoint_of_another_model_is_refused_and_kept(synthetic_run,
                                                         tmp_path):
  model_dir = _copy_of(synthetic_run, tmp_path)
  before = {p: os.path.getmtime(p) for p in glob.glob(f'{model_dir}/*')}
  other = [a for a in runner.TINY if not a.startswith('--num_classes')]
  for change in (['--num_classes=5'], ['--resnet_depth=34', '--num_classes=10']):
    result = runner.run_main([f'--model_dir={model_dir}',
                              '--enable_checkpoint_and_export'] + other +
                             change)
    runner.assert_one_line_error(result, 'holds checkpoints of another model',
                                 '--clean')
  after = {p: os.path.getmtime(p) for p in glob.glob(f'{model_dir}/*')}
  assert before == after


@pytest.mark.slow
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    tmp_path, monkeypatch):
  """The resume is the launcher's restart of a job started with --clean
  (what the supervisor tells the attempt): --clean is for the first attempt
  only. A restart announced at another step than model_dir's stops."""
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)  # 17 training records: 4 steps of 4 per epoch

  def train(model_dir, epochs, extra=()):
    return runner.run_main([
        '-dd', data_dir, '-md', model_dir, '--resnet_depth=10',
        '--width_multiplier=0.25', '--image_size=32', '--batch_size=4',
        f'-te={epochs}',
        '--steps_per_loop=2', '--log_steps=2', '--global_seed=7',
        '--enable_checkpoint_and_export', '--skip_eval', *extra])

  def summary(model_dir, result):
    assert result.returncode == 0, result.stderr[-3000:]
    return runner.read_summary(model_dir)

  resumed_dir = str(tmp_path / 'resumed')
  straight = summary(str(tmp_path / 'straight'),
                     train(str(tmp_path / 'straight'), 2))
  # Interrupted after epoch 1: the straight run as it stood at ckpt-4 (a
  # directory --clean would empty: it adopts a run's files it finds without
  # a record of them, ownership.py).
  runner.copy_run_up_to(str(tmp_path / 'straight'), 4, resumed_dir)
  monkeypatch.setenv(worker_contract.RESTARTS_VAR, '1')
  monkeypatch.setenv(worker_contract.RESUME_STEP_VAR, '4')
  restarted = train(resumed_dir, 2, ['--clean'])
  assert '--clean: not applied to restart 1' in restarted.stderr
  resumed = summary(resumed_dir, restarted)
  assert resumed['resumed_from_step'] == 4 and resumed['train_steps'] == 8
  assert resumed['restarts'] == 1
  assert resumed['train_loss'] == straight['train_loss']
  assert resumed['weights_sha256'] == straight['weights_sha256']

  kept = runner.checkpoint_steps(resumed_dir)
  disagreeing = train(resumed_dir, 3, ['--clean'])
  runner.assert_stopped_with(
      disagreeing, 'restarted this job to resume at step 4', 'checkpoint at '
      'step 8', 'stopped rather than train from another step')
  assert runner.checkpoint_steps(resumed_dir) == kept


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_what_was_written(tmp_path):
  import tensorflow as tf
  model_dir = str(tmp_path / 'small_disk')
  os.makedirs(model_dir)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64M', 'tmpfs',
                  model_dir], check=True)
  try:
    args = [f'--model_dir={model_dir}', '--enable_checkpoint_and_export',
            '--skip_eval'] + runner.TINY[:-4] + ['--steps_per_loop=2',
                                                 '--log_steps=2']
    first = runner.run_main(args + ['--train_steps=2'])
    assert first.returncode == 0, first.stderr[-3000:]
    # Room left for half a checkpoint (weights and momentum): what the run
    # writes before its next save fits, that save does not.
    disk = os.statvfs(model_dir)
    used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
    checkpoint = sum(os.path.getsize(p) for p in glob.glob(
        os.path.join(model_dir, 'ckpt-2.*')))
    subprocess.run(['mount', '-o', f'remount,size={used + checkpoint // 2}',
                    model_dir], check=True)
    full = runner.run_main(args + ['--train_steps=4'])
    runner.assert_stopped_with(full, 'no space left', '--model_dir')
    assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-2')
    tf.train.load_checkpoint(os.path.join(model_dir, 'ckpt-2'))
    assert tf.saved_model.load(os.path.join(model_dir, 'saved_model'))
  finally:
    subprocess.run(['umount', model_dir], check=True)


def _train_losses(metrics_path):
  with open(metrics_path) as f:
    records = [json.loads(line) for line in f]
  return [(r['step'], r.get('train_loss'), r.get('eval_loss'))
          for r in records]


@pytest.mark.slow
def test_same_seed_gives_the_same_losses_step_by_step(tmp_path):
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)

  def train(name, seed):
    # bf16 with matmul convolutions, uint8 images, random crops and flips,
    # several threads per op: every source of drift the defaults have.
    model_dir = str(tmp_path / name)
    result = runner.run_main([
        '-dd', data_dir, '-md', model_dir, '--resnet_depth=10',
        '--width_multiplier=0.25', '--image_size=32', '--batch_size=4',
        '-te=2', '-dt', 'bf16',
        '-dlit', 'uint8', '--steps_per_loop=2', '--log_steps=1',
        f'--global_seed={seed}'])
    assert result.returncode == 0, result.stderr[-3000:]
    return (_train_losses(os.path.join(model_dir, 'metrics.jsonl')),
            runner.read_summary(model_dir)['weights_sha256'])

  first, second, other = train('a', 5), train('b', 5), train('c', 6)
  assert len(first[0]) == 8 + 2           # every step, and both evals
  assert first == second
  assert other[0] != first[0] and other[1] != first[1]


@pytest.fixture(name='truncated_run')
def _truncated_run(synthetic_run, tmp_path):
  """A copy of the shared run (ckpt-4, ckpt-8) whose newest checkpoint was
  cut short, as a crash or a full disk leaves it."""
  model_dir = tmp_path / 'model'
  shutil.copytree(synthetic_run, model_dir)
  data = model_dir / 'ckpt-8.data-00000-of-00001'
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
  return model_dir


def test_a_resume_passes_over_an_unreadable_newest_checkpoint(truncated_run):
  """The job's goodput spans both attempts: the shared run's (checkpoints,
  evaluations, the export, to step 8) and this one's, which redoes steps 5
  to 8 from ckpt-4."""
  bad = truncated_run / 'ckpt-8.data-00000-of-00001'
  size = bad.stat().st_size
  result = runner.run_main(runner.TINY + [f'--model_dir={truncated_run}',
                                          '-te', '3', '--skip_eval'])
  assert result.returncode == 0, result.stderr[-3000:]
  said = [l for l in result.stderr.splitlines() if 'unreadable' in l]
  assert len(said) == 1 and str(bad) in said[0], result.stderr[-3000:]
  summary = runner.read_summary(truncated_run)
  assert summary['resumed_from_step'] == 4
  assert bad.stat().st_size == size  # Left as it was.

  job = summary['goodput']
  assert job['attempts'] == 2 and job['redone_steps'] == 4
  seconds, wall = job['seconds'], job['wall_seconds']
  assert all(seconds[part] > 0 for part in goodput.PARTS
             if part not in ('other', 'stalled'))
  # No peer to wait on: a stall could only be this busy host pausing.
  assert 0 <= seconds['stalled'] < 0.05 * wall
  # The second attempt's stretch begins at the first's last record.
  assert len(job['per_attempt']) == 2 and all(
      0 < share < 1 for share in job['per_attempt'])
  assert sum(seconds.values()) == pytest.approx(wall, rel=0.02)
  # What no part names (plots drawn, files closed) is a small share of the
  # attempts' own time.
  assert 0 <= seconds['other'] < 0.2 * (wall - seconds['waiting'])
  assert job['goodput'] == pytest.approx(seconds['productive'] / wall,
                                         abs=1e-4)
  attempts = goodput.read(str(truncated_run))
  assert [(a['start_step'], a['last_step']) for a in attempts] == [(0, 8),
                                                                  (4, 12)]
  assert all(a['process_start'] < a['ready'] < a['end'] for a in attempts)
  last = result.stderr.strip().splitlines()[-1]
  assert last.endswith(goodput.sentence(job)), last
  assert '(2 attempts), redone' in last and '(4 steps)' in last


@pytest.mark.parametrize('tool', [
    ('resnet_keras.validate', []), ('resnet_keras.export', []),
    ('resnet_keras.average', ['--last', '2']), ('--restore_from', [])],
                         ids=lambda tool: tool[0])
def test_an_unreadable_checkpoint_is_one_line_for_every_reader(
    truncated_run, tmp_path, tool):
  bad = truncated_run / 'ckpt-8.data-00000-of-00001'
  size = bad.stat().st_size
  module, args = tool
  if module == '--restore_from':
    result = runner.run_main(runner.TINY + [
        f'--model_dir={tmp_path / "new"}', f'--restore_from={truncated_run}'])
  else:
    result = runner.run_tool(module, [f'--model_dir={truncated_run}'] + args)
  assert result.returncode == 2
  runner.assert_one_line_error(result, str(bad), 'unreadable')
  assert bad.stat().st_size == size
