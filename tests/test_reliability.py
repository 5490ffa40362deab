"""Stops that lose nothing: signals, non-finite losses, foreign checkpoints
(whole runs; the guard alone: test_guards.py). Signals and kill -9 go to a
real process; the other runs call the trainer's main in this process."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from resnet_keras import guards
from tests import e2e

LONG = [a for a in e2e.TINY if not a.startswith('--train_steps')] + [
    '--train_steps=100000']


def _train_with_checkpoint(model_dir):
  """A tiny run that leaves one checkpoint, at step 4."""
  result = e2e.run_main([f'--model_dir={model_dir}',
                         '--enable_checkpoint_and_export', '--skip_eval'] +
                        e2e.TINY)
  assert result.returncode == 0, result.stderr[-3000:]


def _checkpoint_steps(model_dir):
  return sorted(int(p.rsplit('-', 1)[1].split('.')[0])
                for p in glob.glob(os.path.join(model_dir, 'ckpt-*.index')))


@pytest.mark.processes
@pytest.mark.parametrize('signum,exit_code', [(signal.SIGTERM, 143),
                                              (signal.SIGINT, 130)])
def test_signal_saves_a_checkpoint_and_a_rerun_resumes(tmp_path, signum,
                                                       exit_code):
  model_dir = str(tmp_path / 'model')
  args = [sys.executable, e2e.MAIN, f'--model_dir={model_dir}'] + LONG
  job = subprocess.Popen(args, cwd=e2e.REPO_ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
  seen = []
  deadline = time.time() + 240
  for line in job.stderr:  # Wait for a log line, not a guessed time.
    seen.append(line)
    if 'step 4/' in line:
      break
    assert time.time() < deadline, ''.join(seen)
  job.send_signal(signum)
  rest = job.stderr.read()
  assert job.wait(timeout=120) == exit_code, ''.join(seen) + rest
  saved = [l for l in rest.splitlines() if 'after signal' in l]
  assert saved, rest
  step = int(saved[0].split('saved checkpoint at step ')[1].split()[0])
  assert step >= 4 and _checkpoint_steps(model_dir) == [step]
  assert rest.strip().splitlines()[-1].startswith('error: stopped by SIG')

  resumed = e2e.run_main([f'--model_dir={model_dir}'] + e2e.TINY[:-4] + [
      f'--train_steps={step + 2}', '--steps_per_loop=2', '--log_steps=2',
      '--skip_eval'])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'at step {step}' in resumed.stderr
  assert e2e.read_summary(model_dir)['resumed_from_step'] == step


@pytest.mark.processes
def test_a_signal_ends_a_long_loop_at_the_next_step(tmp_path):
  # 100000 steps in one loop take minutes; the stop must not wait for them.
  model_dir = str(tmp_path / 'model')
  args = [sys.executable, e2e.MAIN, f'--model_dir={model_dir}',
          '--steps_per_loop=100000'] + [
              a for a in LONG if not a.startswith('--steps_per_loop')]
  job = subprocess.Popen(args, cwd=e2e.REPO_ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
  seen = []
  for line in job.stderr:  # The signal handlers are installed by now.
    seen.append(line)
    if 'training to step' in line:
      break
  job.send_signal(signal.SIGTERM)
  try:
    returncode = job.wait(timeout=120)
  finally:
    job.kill()
  rest = job.stderr.read()
  assert returncode == 143, ''.join(seen) + rest
  step = int(rest.split('saved checkpoint at step ')[1].split()[0])
  assert step < 100000 and _checkpoint_steps(model_dir) == [step]
  assert f'stopped by SIGTERM at step {step}' in rest
  assert 'did not update' not in rest  # orbit's short-loop warning


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tmp_path):
  model_dir = str(tmp_path / 'model')
  _train_with_checkpoint(model_dir)
  assert _checkpoint_steps(model_dir) == [4]
  exploding = e2e.run_main([f'--model_dir={model_dir}', '-te', '3',
                            '--enable_checkpoint_and_export', '--skip_eval',
                            '--base_learning_rate=1e30',
                            '--warmup_epochs=0'] + e2e.TINY)
  e2e.assert_stopped_with(exploding, 'training loss is', 'at step',
                            'ckpt-4', '--base_learning_rate')
  assert exploding.returncode == guards.NON_FINITE_EXIT_CODE
  assert _checkpoint_steps(model_dir) == [4]


def test_checkpoint_interval_and_max_checkpoints(tmp_path):
  model_dir = str(tmp_path / 'model')
  result = e2e.run_main([f'--model_dir={model_dir}', '-te', '2',
                         '--enable_checkpoint_and_export', '--skip_eval',
                         '--checkpoint_interval_steps=1', '--steps_per_loop=1',
                         '--max_checkpoints=3'] + e2e.TINY[:-3])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stderr.count('saved checkpoint') == 8  # every step of 2x4
  assert _checkpoint_steps(model_dir) == [6, 7, 8]


def test_checkpoint_of_another_model_is_refused_and_kept(tmp_path):
  model_dir = str(tmp_path / 'model')
  _train_with_checkpoint(model_dir)
  before = {p: os.path.getmtime(p) for p in glob.glob(f'{model_dir}/*')}
  other = [a for a in e2e.TINY if not a.startswith('--num_classes')]
  for change in (['--num_classes=5'], ['--resnet_depth=34', '--num_classes=10']):
    result = e2e.run_main([f'--model_dir={model_dir}',
                           '--enable_checkpoint_and_export'] + other + change)
    e2e.assert_one_line_error(result, 'holds checkpoints of another model',
                              '--clean')
  after = {p: os.path.getmtime(p) for p in glob.glob(f'{model_dir}/*')}
  assert before == after


_EVERY_2_STEPS = ['--enable_checkpoint_and_export',
                  '--checkpoint_interval_steps=2', '--max_checkpoints=2',
                  '--skip_eval']


def _start_and_kill(model_dir, after_step, delay):
  """Starts a checkpointing run, SIGKILLs it `delay` s after a step line."""
  args = [sys.executable, e2e.MAIN, f'--model_dir={model_dir}'] + (
      _EVERY_2_STEPS + LONG)
  job = subprocess.Popen(args, cwd=e2e.REPO_ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  seen = []
  for line in job.stderr:
    seen.append(line)
    if f'step {after_step}/' in line:
      break
    assert time.time() < deadline and job.poll() is None, ''.join(seen)
  time.sleep(delay)  # Lands anywhere: in a step, a save or between them.
  job.kill()
  job.wait(timeout=60)
  seen.append(job.stderr.read())  # What it logged until the kill.
  return int(''.join(seen).rsplit('step ', 1)[1].split('/')[0])


@pytest.mark.processes
def test_kill_9_never_leaves_an_unloadable_checkpoint(tmp_path):
  import tensorflow as tf
  model_dir = str(tmp_path / 'model')
  rng = np.random.default_rng(0)
  resumed_from = 0
  for round_ in range(3):
    last_logged = _start_and_kill(model_dir, resumed_from + 4,
                                  float(rng.uniform(0, 1.5)))
    for step in _checkpoint_steps(model_dir):   # Every kept one loads.
      reader = tf.train.load_checkpoint(os.path.join(model_dir,
                                                     f'ckpt-{step}'))
      assert reader.get_variable_to_shape_map(), step
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest, f'round {round_}: no checkpoint after step {last_logged}'
    latest_step = int(latest.rsplit('-', 1)[1])
    # At most one checkpoint interval (2 steps) of logged work is lost.
    assert latest_step >= last_logged - 2, (latest_step, last_logged)
    resumed = e2e.run_main(
        [f'--model_dir={model_dir}'] + _EVERY_2_STEPS + e2e.TINY[:-4] +
        [f'--train_steps={latest_step + 2}', '--steps_per_loop=2',
         '--log_steps=2'])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = e2e.read_summary(model_dir)
    assert summary['resumed_from_step'] == latest_step, summary
    assert summary['train_steps'] == latest_step + 2
    resumed_from = summary['train_steps']


@pytest.mark.slow
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
  from tests.imagenet_fixture import write_dataset
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)  # 17 training records: 4 steps of 4 per epoch

  def train(model_dir, epochs):
    result = e2e.run_main([
        '-dd', data_dir, '-md', model_dir, '--resnet_depth=10',
        '--width_multiplier=0.25', '--image_size=32', '--batch_size=4',
        f'-te={epochs}',
        '--steps_per_loop=2', '--log_steps=2', '--global_seed=7',
        '--enable_checkpoint_and_export', '--skip_eval'])
    assert result.returncode == 0, result.stderr[-3000:]
    return e2e.read_summary(model_dir)

  straight = train(str(tmp_path / 'straight'), 2)
  train(str(tmp_path / 'resumed'), 1)           # "interrupted" after epoch 1
  resumed = train(str(tmp_path / 'resumed'), 2)
  assert resumed['resumed_from_step'] == 4 and resumed['train_steps'] == 8
  assert resumed['train_loss'] == straight['train_loss']
  assert resumed['weights_sha256'] == straight['weights_sha256']


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_what_was_written(tmp_path):
  import tensorflow as tf
  model_dir = str(tmp_path / 'small_disk')
  os.makedirs(model_dir)
  # Room for one checkpoint (weights + momentum, ~90 MB) and the export
  # (~45 MB) of a ResNet-18, not for a second checkpoint.
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=180M', 'tmpfs',
                  model_dir], check=True)
  try:
    args = [f'--model_dir={model_dir}', '--enable_checkpoint_and_export',
            '--skip_eval'] + e2e.TINY[:-4] + ['--steps_per_loop=2',
                                              '--log_steps=2',
                                              '--resnet_depth=18',
                                              '--width_multiplier=1']
    first = e2e.run_main(args + ['--train_steps=2'])
    assert first.returncode == 0, first.stderr[-3000:]
    full = e2e.run_main(args + ['--train_steps=4'])
    e2e.assert_stopped_with(full, 'no space left', '--model_dir')
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
  from tests.imagenet_fixture import write_dataset
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)

  def train(name, seed):
    # bf16 with matmul convolutions, uint8 images, random crops and flips,
    # several threads per op: every source of drift the defaults have.
    model_dir = str(tmp_path / name)
    result = e2e.run_main([
        '-dd', data_dir, '-md', model_dir, '--resnet_depth=10',
        '--width_multiplier=0.25', '--image_size=32', '--batch_size=4',
        '-te=2', '-dt', 'bf16',
        '-dlit', 'uint8', '--steps_per_loop=2', '--log_steps=1',
        f'--global_seed={seed}'])
    assert result.returncode == 0, result.stderr[-3000:]
    return (_train_losses(os.path.join(model_dir, 'metrics.jsonl')),
            e2e.read_summary(model_dir)['weights_sha256'])

  first, second, other = train('a', 5), train('b', 5), train('c', 6)
  assert len(first[0]) == 8 + 2           # every step, and both evals
  assert first == second
  assert other[0] != first[0] and other[1] != first[1]
