"""Real 2-process jobs through demo_resnet_keras.py (mpirun on this host).

Horovod and multi_worker_mirrored each train a tiny model (reading a tf.data
service); both workers must end with identical weights. A job whose worker
dies must end, non-zero, without leaving processes behind.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.support import deadlines
from tests.support import records
from tests.support import runner

# One mpirun job at a time: its ranks share this machine's cores, and jobs on
# this host would share the multi_worker_mirrored ports.
pytestmark = pytest.mark.xdist_group('mpirun')

DEMO = os.path.join(runner.REPO_ROOT, 'demo_resnet_keras.py')
TINY = [a for a in runner.TINY if not a.startswith('--batch_size')]


def _summaries(model_dir):
  return (runner.read_summary(model_dir),
          runner.read_summary(os.path.join(model_dir, 'worker_1')))


def _assert_in_lockstep(model_dir, output, image_size, num_classes):
  """A 2-worker run's chief and worker agree, and the chief alone exported;
  returns their run summaries."""
  chief, worker = _summaries(model_dir)
  # The chief alone exports, and the export needs no Horovod (not imported
  # here) nor any collective to load and run in training mode.
  assert not os.path.exists(os.path.join(model_dir, 'worker_1', 'saved_model'))
  loaded = tf.saved_model.load(os.path.join(model_dir, 'saved_model'))
  images = tf.zeros([2, image_size, image_size, 3])
  assert loaded(images, training=True).shape == (2, num_classes)
  assert chief['weights_sha256'] == worker['weights_sha256']
  # Losses and accuracies are reduced over the workers: both log the same.
  assert chief['train_loss'] == pytest.approx(worker['train_loss'])
  assert chief['train_accuracy'] == pytest.approx(worker['train_accuracy'])
  # The guard's check after each loop is a traced collective: no worker runs
  # the strategy eagerly (TensorFlow warns of that, and it costs every loop).
  assert 'eagerly has significant overhead' not in output
  return chief, worker


# The time-to-accuracy techniques together (e2e/test_training_techniques.py):
# two epochs at 24 then 32 px, evaluation and export at 40 px, the weight
# average swapped in for them; and timm's that act on synthetic batches
# (mixup/CutMix, drop path, LAMB with clipping, BCE).
TECHNIQUES = ['--stem=small', '--train_epochs=2',
              '--progressive_resize_start_size=24', '--eval_image_size=40',
              '--zero_init_residual', '--blurpool', '--ema_decay=0.5',
              '--ema_warmup', '--eval_flip', '--lr_schedule=linear',
              '--lr_per_epoch', '--label_smoothing=0.1',
              '--mixup_alpha=0.2', '--cutmix_alpha=1.0',
              '--drop_path_rate=0.1', '--optimizer=LAMB',
              '--clip_grad_norm=1', '--loss=bce']


@pytest.mark.parametrize('backend_args,batch_flag,global_batch', [
    # -bs per worker; Horovod's batch norm synchronises over the workers.
    (['--use_horovod', '--sync_batch_norm'], '--batch_size=8', 16),
    (['-ds', 'multi_worker_mirrored'] + TECHNIQUES, '--batch_size=16',
     16),  # -bs global
    # Horovod with the techniques and accumulated gradients: the exact
    # resume below, whose workers must also agree.
])
def test_two_workers_train_in_lockstep(service_records, in_process_service,
                                       tmp_path, backend_args, batch_flag,
                                       global_batch):
  """The workers read their batches from one tf.data service job (its
  servers in this process, each batch to one worker): the 2-process service
  read of test_data_service.py, folded into these jobs rather than run as
  two more."""
  dispatcher, workers = in_process_service
  model_dir = str(tmp_path / 'model')
  on_records = [a for a in TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes'))]
  result = runner.spawn_script(
      DEMO, backend_args + ['--num_workers_per_hls=2', batch_flag,
                            f'--model_dir={model_dir}',
                            '--enable_checkpoint_and_export',
                            f'--data_dir={service_records}',
                            f'--tf_data_service={dispatcher.target}'] +
      on_records, timeout=300)
  techniques = '--ema_decay=0.5' in backend_args
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  output = result.stdout + result.stderr
  chief, worker = _assert_in_lockstep(model_dir, output,
                                      40 if techniques else 32, 4)
  assert chief['num_workers'] == worker['num_workers'] == 2
  assert (chief['worker_index'], worker['worker_index']) == (0, 1)
  assert chief['global_batch_size'] == global_batch
  assert chief['train_steps'] == (8 if techniques else 4)
  assert re.search(rf'saved checkpoint at step {chief["train_steps"]} .*: '
                   'training blocked .* in the background', output), output
  if techniques:  # Both workers trained at both sizes, in step.
    assert 'training at 32 px from epoch 1' in output
    # Each worker wrote its own copy of the collective saves in the
    # background: the last ones alike (batch-norm statistics and their
    # averages read as their mean over the workers), whole.
    final = [runner.checkpoint_values(os.path.join(d, 'ckpt-8')) for d in (
        model_dir, os.path.join(model_dir, 'worker_1', 'checkpoints'))]
    assert final[0].keys() == final[1].keys()
    assert any(n.startswith('weight_average/') for n in final[0])
    for name in final[0]:
      np.testing.assert_array_equal(final[0][name], final[1][name],
                                    err_msg=name)
  # Every validation example once, over both (evaluation reads the records
  # itself).
  assert chief['eval_examples'] == 9
  assert chief['tf_data_service']['address'] == dispatcher.target
  assert worker['tf_data_service'] == chief['tf_data_service']
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access


def _rank_pids(launcher_pid):
  """pid -> MPI rank of the trainer processes under the launcher's mpirun."""
  ranks = {}
  for pid in os.listdir('/proc'):
    if not pid.isdigit():
      continue
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        environ = dict(item.split(b'=', 1) for item in f.read().split(b'\0')
                       if b'=' in item)
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read()
    except OSError:
      continue
    if (b'resnet_ctl_imagenet_main.py' in cmdline and
        b'OMPI_COMM_WORLD_RANK' in environ and
        environ.get(b'RESNET_TEST_JOB') == str(launcher_pid).encode()):
      ranks[int(pid)] = int(environ[b'OMPI_COMM_WORLD_RANK'])
  return ranks


def _start_long_job(tmp_path, backend_args):
  """A 2-worker job through the launcher, once it logged step 2."""
  log = open(tmp_path / 'log.txt', 'w+')
  env = dict(os.environ, RESNET_TEST_JOB='pending')
  args = [sys.executable, DEMO] + backend_args + [
      '--num_workers_per_hls=2', f'--model_dir={tmp_path / "model"}',
      '--batch_size=8', '--train_steps=100000', '--train_epochs=1'] + [
          a for a in TINY if not a.startswith(('--train_steps', '--batch'))]
  # The launcher execs mpirun, so its pid is mpirun's; tag the job with it.
  job = subprocess.Popen(['sh', '-c', 'RESNET_TEST_JOB=$$ exec "$@"', 'sh'] +
                         args, cwd=runner.REPO_ROOT, stdout=log,
                         stderr=subprocess.STDOUT, env=env)
  deadline = time.time() + deadlines.stretched(240)
  while 'step 2/' not in (tmp_path / 'log.txt').read_text():
    assert job.poll() is None, (tmp_path / 'log.txt').read_text()[-3000:]
    assert time.time() < deadline, 'training did not start'
    time.sleep(1)  # Polls a log file for a line; not a guessed wait.
  return job, log


@pytest.mark.parametrize('backend_args', [
    ['--use_horovod'], ['-ds', 'multi_worker_mirrored']])
def test_a_dead_worker_ends_the_job(tmp_path, backend_args):
  job, log = _start_long_job(tmp_path, backend_args)
  try:
    ranks = _rank_pids(job.pid)
    assert sorted(ranks.values()) == [0, 1], ranks
    victim = next(pid for pid, rank in ranks.items() if rank == 1)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    returncode = job.wait(timeout=60)
    assert returncode != 0
    assert time.time() - killed_at < 60
    output = (tmp_path / 'log.txt').read_text()
    assert 'rank 1' in output or '[[' in output and ',1]' in output, output[-2000:]
    time.sleep(1)
    assert not _rank_pids(job.pid), 'a worker outlived the job'
  finally:
    if job.poll() is None:
      job.kill()
    log.close()


def _two_ranks_stuck_after_15_s(tmp_path, timeout_var, args):
  """mpirun by hand, 2 ranks of the tiny trainer with `args`, the
  stuck-worker time (`timeout_var`, as the launcher sets it) 15 s at the
  reference pace (stretched to this machine's: it bounds the first loop's
  tracing too, which took over 15 s beside two busy processes); the
  process and its log file."""
  log = open(tmp_path / 'log.txt', 'w+')
  root = ['--allow-run-as-root'] if os.geteuid() == 0 else []
  stuck = str(round(deadlines.stretched(15)))
  env = dict(os.environ, RESNET_TEST_JOB='pending', **{timeout_var: stuck})
  flags = {a.split('=')[0] for a in args}
  trainer = [sys.executable, os.path.join(runner.REPO_ROOT,
                                          'resnet_ctl_imagenet_main.py'),
             f'--model_dir={tmp_path / "model"}', '--batch_size=8'] + args + [
                 a for a in TINY if a.split('=')[0] not in flags | {
                     '--batch_size'}]
  job = subprocess.Popen(
      ['sh', '-c', 'RESNET_TEST_JOB=$$ exec "$@"', 'sh', 'mpirun'] + root + [
          '-np', '2', '--oversubscribe', '-x', 'RESNET_TEST_JOB', '-x',
          timeout_var] + trainer,
      cwd=runner.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
  return job, log


# The line that names a frozen worker: the watchdog's under Horovod, whose
# stall check waits with its negotiation and never fires; under
# multi_worker_mirrored TensorFlow's coordination service misses the
# frozen one's heartbeats first (the watchdog is for a worker that is stuck
# but still beats).
FROZEN_NAMED = {'horovod': "worker 0: the job's collectives have not moved for",
                'mwm': 'stopped sending heartbeats'}


@pytest.mark.parametrize('backend_args,timeout_var,named', [
    (['--use_horovod'], 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS', 'horovod'),
    (['-ds', 'multi_worker_mirrored'], 'RESNET_KERAS_COLLECTIVE_TIMEOUT',
     'mwm')])
def test_a_worker_waiting_on_a_frozen_one_ends_itself(tmp_path, backend_args,
                                                      timeout_var, named):
  """A rank frozen (SIGSTOP) mid-run: the job ends within the stuck-worker
  time (the launcher's 10 x --failure_timeout, 15 s here: mpirun by hand),
  the frozen rank with it. multi_worker_mirrored's collective timeout, no
  longer used, held a thread per collective for its whole length: the
  workers' threads grew with the steps."""
  job, log = _two_ranks_stuck_after_15_s(
      tmp_path, timeout_var, backend_args + ['--train_steps=100000',
                                             '--train_epochs=1'])
  try:
    deadline = time.time() + deadlines.stretched(240)
    while 'step 40/' not in (tmp_path / 'log.txt').read_text():
      assert job.poll() is None, (tmp_path / 'log.txt').read_text()[-3000:]
      assert time.time() < deadline, 'training did not reach step 40'
      time.sleep(1)  # Polls a log file for a line; not a guessed wait.
    ranks = _rank_pids(job.pid)
    # Some 40 steps of collectives: the threads stay few (with the
    # collective timeout each rank held some 500 more).
    for pid in ranks:
      assert len(os.listdir(f'/proc/{pid}/task')) < 300
    frozen = next(pid for pid, rank in ranks.items() if rank == 1)
    os.kill(frozen, signal.SIGSTOP)
    assert job.wait(timeout=deadlines.stretched(180)) != 0
    output = (tmp_path / 'log.txt').read_text()
    assert FROZEN_NAMED[named] in output, output[-3000:]
    deadline = time.time() + 10
    while _rank_pids(job.pid) and time.time() < deadline:
      time.sleep(0.2)  # The frozen rank being reaped: polled.
    assert not _rank_pids(job.pid), 'a worker outlived the job'
  finally:
    if job.poll() is None:
      job.kill()
    for pid in _rank_pids(job.pid):
      os.kill(pid, signal.SIGKILL)
    log.close()


@pytest.mark.parametrize('backend_args,timeout_var', [
    (['--use_horovod'], 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'),
    (['-ds', 'multi_worker_mirrored'], 'RESNET_KERAS_COLLECTIVE_TIMEOUT')],
                         ids=['horovod', 'mwm'])
def test_a_worker_waiting_for_a_frozen_one_to_join_ends_itself(
    tmp_path, backend_args, timeout_var):
  """A rank frozen as it starts (the soak: frozen while a restart's ranks
  came up): the others wait in hvd.init() or multi_worker_mirrored's start
  for every worker to join, and end themselves after the stuck-worker time
  (15 s here) instead of waiting there for good."""
  job, log = _two_ranks_stuck_after_15_s(tmp_path, timeout_var,
                                         backend_args)
  try:
    deadline = time.time() + 60
    frozen = None
    while frozen is None:
      assert job.poll() is None and time.time() < deadline, (
          tmp_path / 'log.txt').read_text()[-3000:]
      frozen = next((pid for pid, rank in _rank_pids(job.pid).items()
                     if rank == 1), None)
      time.sleep(0.05)  # Polls /proc for the rank's process.
    os.kill(frozen, signal.SIGSTOP)
    assert job.wait(timeout=deadlines.stretched(180)) != 0
    output = (tmp_path / 'log.txt').read_text()
    assert "worker 0: the job's collectives have not moved for" in output, (
        output[-3000:])
    assert 'step 2/' not in output  # It never trained.
  finally:
    if job.poll() is None:
      job.kill()
    for pid in _rank_pids(job.pid):
      os.kill(pid, signal.SIGKILL)
    log.close()


@pytest.mark.parametrize('backend_args,signalled_ranks', [
    (['-ds', 'multi_worker_mirrored'], (0, 1)),  # A preemption of the job.
    # One worker's signal stops both at the same step (no worker left
    # waiting in a collective), and the unsignalled chief saves.
    (['--use_horovod'], (1,)),
])
def test_preempted_workers_agree_and_the_chief_saves(tmp_path, backend_args,
                                                     signalled_ranks):
  # Loops of 2 steps: a signal usually lands inside one, where the
  # workers' stop flags are combined before each step.
  job, log = _start_long_job(tmp_path, backend_args)
  try:
    ranks = _rank_pids(job.pid)
    assert sorted(ranks.values()) == [0, 1], ranks
    for pid, rank in ranks.items():
      if rank in signalled_ranks:
        os.kill(pid, signal.SIGTERM)
    assert job.wait(timeout=120) != 0
    output = (tmp_path / 'log.txt').read_text()
    saved = [l for l in output.splitlines() if 'after signal' in l]
    assert saved, output[-3000:]
    step = int(saved[0].split('saved checkpoint at step ')[1].split()[0])
    assert os.path.exists(tmp_path / 'model' / f'ckpt-{step}.index')
    assert output.count(f'stopped by SIGTERM at step {step}') == 2, output[-3000:]
    assert 'did not update' not in output  # orbit's short-loop warning
  finally:
    if job.poll() is None:
      job.kill()
    log.close()


def test_port_in_use_is_one_line(tmp_path):
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.bind(('', 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    tf_config = json.dumps({'cluster': {'worker': [f'localhost:{port}']},
                            'task': {'type': 'worker', 'index': 0}})
    model_dir = tmp_path / 'run'
    result = runner.spawn_main(['-ds', 'multi_worker_mirrored',
                                f'--model_dir={model_dir}'] + runner.TINY,
                               env={'TF_CONFIG': tf_config}, timeout=120)
  runner.assert_one_line_error(result, f'port {port}', 'not free',
                               'TF_BASE_PORT')
  assert not model_dir.exists()


def test_two_workers_resume_the_techniques_exactly(tmp_path):
  """The time-to-accuracy techniques under Horovod's 2 processes
  (e2e/test_training_techniques.py's run, its per-worker batch halved and
  accumulated in 2 micro-batches, its ramp in 2 epochs: 24 then 32 px):
  its workers in lockstep, and resumed from the straight run's epoch-1
  checkpoint, it ends as the straight run: both workers' weights, every
  variable of the last checkpoint, the weight average's included, and the
  evaluations (which read the other worker's batch-norm statistics too: it
  takes the chief's at each loop's end, as a resume gives them). (A resume
  from a checkpoint that ended a run: the e2e test, in one process.)"""
  # records_run's records (16 training and 9 validation images, 6 classes),
  # without the run trained on them, which nothing here reads.
  data_dir = str(tmp_path / 'data')
  records.write_dataset(data_dir, num_classes=len(records.CLASS_NAMES),
                        train_per_shard=(8, 8), eval_per_shard=(5, 4))
  # One image size per epoch: each size is a trace of its own in each
  # worker, the most of these runs' time.
  # No plots: nothing reads them (3 s of CPU in each run's chief).
  techniques = [a for a in runner.TECHNIQUES if not a.startswith(
      ('--batch_size', '--progressive_resize_epochs'))] + [
          '--progressive_resize_epochs=0,1', '--noplots']

  def train(model_dir, epochs):
    # Accumulated gradients take Horovod's explicit all-reduce: without it
    # the workers' weights would drift apart.
    result = runner.spawn_script(
        DEMO, ['--use_horovod', '--num_workers_per_hls=2', '--batch_size=2',
               '--num_accumulation_steps=2', f'--data_dir={data_dir}',
               f'--model_dir={model_dir}', f'--train_epochs={epochs}'] +
        techniques, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr

  straight_dir = str(tmp_path / 'straight')
  output = train(straight_dir, 2)
  straight = _assert_in_lockstep(straight_dir, output, 40, 6)
  # Both workers trained at both sizes, in step.
  assert 'training at 32 px from epoch 1' in output
  assert 'gradient accumulation: 2 micro-batches of 1 per replica' in output
  runner.copy_run_up_to(straight_dir, 4, str(tmp_path / 'resumed'))
  train(str(tmp_path / 'resumed'), 2)
  resumed = _summaries(str(tmp_path / 'resumed'))
  assert resumed[0]['resumed_from_step'] == 4
  assert straight[0]['global_batch_size'] == 4
  hashes = {s['weights_sha256'] for s in straight + resumed}
  assert len(hashes) == 1
  final = [runner.checkpoint_values(str(tmp_path / d / 'ckpt-8'))
           for d in ('straight', 'resumed')]
  assert any(n.startswith('weight_average/') for n in final[0])
  assert final[0].keys() == final[1].keys()
  for name in final[0]:
    np.testing.assert_array_equal(final[0][name], final[1][name],
                                  err_msg=name)
  assert straight[0]['eval_examples'] == resumed[0]['eval_examples'] == 9
  for key in ('eval_accuracy', 'eval_loss'):
    assert straight[0][key] == resumed[0][key], key
