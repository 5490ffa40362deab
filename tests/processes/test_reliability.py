"""Stops that lose nothing, sent to a training process of its own: SIGTERM
and SIGINT save a checkpoint a rerun resumes, a signal ends even a long
loop at the next step, kill -9 never leaves an unloadable checkpoint. (The
other stops, in this process: e2e/; the guard alone: unit/.)"""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from resnet_keras.rundir import checkpoints
from tests.support import runner

LONG = [a for a in runner.TINY if not a.startswith('--train_steps')] + [
    '--train_steps=100000']


@pytest.mark.parametrize('signum,exit_code', [(signal.SIGTERM, 143),
                                              (signal.SIGINT, 130)])
def test_signal_saves_a_checkpoint_and_a_rerun_resumes(tmp_path, signum,
                                                       exit_code):
  model_dir = str(tmp_path / 'model')
  args = [sys.executable, runner.MAIN, f'--model_dir={model_dir}'] + LONG
  job = subprocess.Popen(args, cwd=runner.REPO_ROOT, stdout=subprocess.DEVNULL,
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
  assert step >= 4 and runner.checkpoint_steps(model_dir) == [step]
  assert rest.strip().splitlines()[-1].startswith('error: stopped by SIG')

  resumed = runner.run_main([f'--model_dir={model_dir}'] + runner.TINY[:-4] + [
      f'--train_steps={step + 2}', '--steps_per_loop=2', '--log_steps=2',
      '--skip_eval'])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'at step {step}' in resumed.stderr
  assert runner.read_summary(model_dir)['resumed_from_step'] == step


def test_a_signal_ends_a_long_loop_at_the_next_step(tmp_path):
  # 100000 steps in one loop take minutes; the stop must not wait for them.
  model_dir = str(tmp_path / 'model')
  args = [sys.executable, runner.MAIN, f'--model_dir={model_dir}',
          '--steps_per_loop=100000'] + [
              a for a in LONG if not a.startswith('--steps_per_loop')]
  job = subprocess.Popen(args, cwd=runner.REPO_ROOT, stdout=subprocess.DEVNULL,
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
  assert step < 100000 and runner.checkpoint_steps(model_dir) == [step]
  assert f'stopped by SIGTERM at step {step}' in rest
  assert 'did not update' not in rest  # orbit's short-loop warning


_EVERY_2_STEPS = ['--enable_checkpoint_and_export',
                  '--checkpoint_interval_steps=2', '--max_checkpoints=2',
                  '--skip_eval']


def _start_and_kill(model_dir, after_step, delay):
  """Starts a checkpointing run, SIGKILLs it `delay` s after a step line."""
  args = [sys.executable, runner.MAIN, f'--model_dir={model_dir}'] + (
      _EVERY_2_STEPS + LONG)
  job = subprocess.Popen(args, cwd=runner.REPO_ROOT, stdout=subprocess.DEVNULL,
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
  return int(re.findall(r' step (\d+)/', ''.join(seen))[-1])


def test_kill_9_never_leaves_an_unloadable_checkpoint(tmp_path):
  import tensorflow as tf
  model_dir = str(tmp_path / 'model')
  rng = np.random.default_rng(0)
  resumed_from = 0
  for round_ in range(3):
    last_logged = _start_and_kill(model_dir, resumed_from + 4,
                                  float(rng.uniform(0, 1.5)))
    for step in runner.checkpoint_steps(model_dir):   # Every kept one loads.
      reader = tf.train.load_checkpoint(os.path.join(model_dir,
                                                     f'ckpt-{step}'))
      assert reader.get_variable_to_shape_map(), step
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest, f'round {round_}: no checkpoint after step {last_logged}'
    latest_step = int(latest.rsplit('-', 1)[1])
    # At most two checkpoint intervals (2 steps each) of logged work are
    # lost: a save's write goes on beside the next loop, and the kill may
    # come before it ends.
    assert latest_step >= last_logged - 4, (latest_step, last_logged)
    resumed = runner.run_main(
        [f'--model_dir={model_dir}'] + _EVERY_2_STEPS + runner.TINY[:-4] +
        [f'--train_steps={latest_step + 2}', '--steps_per_loop=2',
         '--log_steps=2'])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = runner.read_summary(model_dir)
    assert summary['resumed_from_step'] == latest_step, summary
    assert summary['train_steps'] == latest_step + 2
    resumed_from = summary['train_steps']


# Two saves through the trainer's Saver of a checkpoint large enough
# (256 MiB) that its write lasts a good part of a second, the second left
# writing.
_TWO_SAVES = r"""
import sys, time
import tensorflow as tf, tf_keras
from resnet_keras.engine import distribution
from resnet_keras.rundir import checkpoints
from resnet_keras.training import goodput
model = tf_keras.Sequential([tf_keras.Input([8192]),
                             tf_keras.layers.Dense(8192, use_bias=False)])
saver = checkpoints.Saver(
    checkpoints.make_manager(model, tf_keras.optimizers.legacy.SGD(0.1),
                             sys.argv[1]),
    distribution.Backend(tf.distribute.get_strategy()))
attempt = goodput.Attempt(None, time.time(), 0)
saver.save(1, attempt)
saver.wait(attempt)
print('written', flush=True)
saver.save(2, attempt)
time.sleep(600)
"""


def test_kill_9_during_a_background_write_leaves_the_checkpoint_before(
    tmp_path):
  model_dir = tmp_path / 'model'
  job = subprocess.Popen([sys.executable, '-c', _TWO_SAVES, str(model_dir)],
                         cwd=runner.REPO_ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
  # TensorFlow writes a checkpoint's data in a folder of its own under a
  # temporary name, renamed once complete.
  writing = lambda: glob.glob(str(model_dir / 'ckpt-2_temp' / '*tempstate*'))
  try:
    assert job.stdout.readline() == 'written\n'
    deadline = time.time() + 60
    while not writing():
      assert time.time() < deadline and job.poll() is None
      time.sleep(0.002)  # Polls for the file; its write lasts far longer.
    job.send_signal(signal.SIGSTOP)
    assert writing(), 'the write ended before the stop (and so the kill)'
    job.kill()
    job.wait(timeout=60)
  finally:
    if job.poll() is None:
      job.kill()
  assert checkpoints.latest(str(model_dir)) == (str(model_dir / 'ckpt-1'), 1)
  assert not (model_dir / 'ckpt-2.index').exists()
