"""Jobs across hosts: the launcher, exactly as the README runs it, on a
cluster of network-namespace hosts (testbed/cluster.py). They need root
(network namespaces) and skip without it, saying so.

Training with Horovod and multi_worker_mirrored, failures that must end the
job in bounded time with the lost host named, an outage that must not, the
pre-flight check, and a restart that must end with an uninterrupted run's
weights.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from testbed import cluster as cluster_lib
from tests.support import launcher
from tests.support import runner
from tests.support.records import write_dataset

TINY, TRAINER = launcher.TINY, launcher.TRAINER
FAILURE_TIMEOUT = 60  # The launcher's default --failure_timeout.
# The failure tests set their own, shorter one: it is what bounds the time to
# exit, so the test also proves the flag reaches mpirun and the workers (the
# default's keepalive settings: unit/test_launch.py), in half the wait.
SHORT_FAILURE_TIMEOUT = 24

_missing = cluster_lib.missing_requirements()
# One job of this module at a time, on its cluster, built once in one
# worker. Its jobs run inside the cluster's namespaces, so their ports never
# meet those of processes/test_multi_worker.py's jobs on this host: the two
# modules' chains run side by side (one chain was the suite's critical path:
# 1,750 s of its 1,980 s, 2026-11-29).
pytestmark = [pytest.mark.skipif(_missing is not None,
                                 reason=f'no test cluster: {_missing}'),
              pytest.mark.xdist_group('cluster_multi_host')]
# The cluster of this module (conftest.py): its hosts, and the subnets
# 10.77.N.0/24 it may take (the other module's are apart).
CLUSTER_HOSTS = 2
CLUSTER_SUBNETS = range(100, 250)


# One run shared by the Horovod test and the restart test, which must end
# with its weights. Steps enough that the restart's kill, once ckpt-4 is
# logged, lands mid-run.
STEPS = 96
SEEDED = ['--global_seed=7', '--checkpoint_interval_steps=4',
          '--enable_checkpoint_and_export',
          '--batch_size=8', f'--train_steps={STEPS}', '--train_epochs=1']


@pytest.fixture(scope='module')
def horovod_run(cluster, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp('horovod') / 'model'
  started = time.monotonic()
  returncode, output = launcher.run(
      cluster, ['--use_horovod', '--num_workers_per_hls=1',
                f'--model_dir={model_dir}'] + SEEDED + TINY,
      model_dir.parent / 'log.txt')
  print(f'Horovod 2 hosts x 1 worker: {time.monotonic() - started:.0f} s')
  assert returncode == 0, output[-4000:]
  return str(model_dir), output


def _assert_ran_across_hosts(cluster, summaries, global_batch, train_steps):
  hosts = {(s['host']['hostname'], s['host']['address']) for s in summaries}
  expected = {(h.name, h.address) for h in cluster.hosts}
  assert hosts == expected, hosts  # Every host ran a worker, and only they.
  assert len({s['weights_sha256'] for s in summaries}) == 1
  for summary in summaries:
    assert summary['num_workers'] == len(summaries)
    assert summary['global_batch_size'] == global_batch
    assert summary['train_steps'] == train_steps
  assert summaries[0]['eval_examples'] == 13


def test_horovod_one_worker_per_host(cluster, horovod_run):
  model_dir, output = horovod_run
  summaries = launcher.summaries(model_dir, 2)
  _assert_ran_across_hosts(cluster, summaries, global_batch=16,
                           train_steps=STEPS)
  assert summaries[0]['restarts'] == 0
  # Only the chief wrote checkpoints and the export.
  assert os.path.exists(os.path.join(model_dir, 'saved_model'))
  assert os.path.exists(os.path.join(model_dir, f'ckpt-{STEPS}.index'))
  worker_dir = os.path.join(model_dir, 'worker_1')
  assert sorted(os.listdir(worker_dir)) == ['run_summary.json']
  assert not launcher.error_lines(output), launcher.error_lines(output)


@pytest.mark.parametrize('backend_args,batch,workers_per_host', [
    # Two workers per host on 2 CPUs: oversubscribed, -np 4.
    (['--use_horovod'], '--batch_size=4', 2),
    # -bs is the global batch; each rank's TF_CONFIG names the hosts.
    (['-ds', 'multi_worker_mirrored'], '--batch_size=16', 1),
])
def test_training_across_hosts(cluster, tmp_path, backend_args, batch,
                               workers_per_host):
  model_dir, temp = tmp_path / 'model', tmp_path / 'tmp'
  temp.mkdir()
  started = time.monotonic()
  returncode, output = launcher.run(
      cluster, backend_args + [f'--num_workers_per_hls={workers_per_host}',
                               batch, '--train_steps=4',
                               f'--model_dir={model_dir}',
                               '--enable_checkpoint_and_export'] + TINY,
      tmp_path / 'log.txt', env={'TMPDIR': str(temp)})
  print(f'{backend_args} 2 hosts x {workers_per_host}: '
        f'{time.monotonic() - started:.0f} s')
  assert returncode == 0, output[-4000:]
  num_workers = 2 * workers_per_host
  summaries = launcher.summaries(str(model_dir), num_workers)
  _assert_ran_across_hosts(cluster, summaries, global_batch=16,
                           train_steps=4)
  if 'multi_worker_mirrored' in backend_args:
    addresses = [h.address for h in cluster.hosts]
    for rank, address in enumerate(addresses):
      assert (f'"worker": ["{addresses[0]}:2410", "{addresses[1]}:2410"]'
              f'}}, "task": {{"type": "worker", "index": {rank}}}') in output
  assert os.path.exists(model_dir / 'saved_model')
  for worker in range(1, num_workers):
    assert not os.path.exists(model_dir / f'worker_{worker}' / 'saved_model')
  assert not launcher.error_lines(output), launcher.error_lines(output)
  # The launcher's hostfile for mpirun goes with the job.
  assert not list(temp.glob('resnet_keras_launch_*'))


def _start_long_job(cluster, tmp_path, extra=()):
  log_path = tmp_path / 'log.txt'
  job = launcher.start(
      cluster, ['--use_horovod', '--num_workers_per_hls=1', '--batch_size=8',
                '--train_steps=100000', '--train_epochs=1',
                f'--model_dir={tmp_path / "m"}'] + list(extra) + TINY,
      log_path)
  launcher.wait_for_line(job, log_path, 'step 2/')
  return job, log_path


def _kill_rank(cluster, host):
  for pid in cluster.processes(host, TRAINER):
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize('failure,expected', [
    (_kill_rank, 'rank 1 on host {address} was killed by SIGKILL'),
    (lambda cluster, host: cluster.kill_host_processes(host),
     'host {address}'),
    (lambda cluster, host: cluster.cut_link(host),
     'lost contact with host {address} (rank 1)'),
    (lambda cluster, host: cluster.black_hole(host),
     'lost contact with host {address} (rank 1)'),
], ids=['kill_rank', 'kill_host_processes', 'cut_link', 'black_hole'])
def test_a_failure_ends_the_job_in_bounded_time(healthy, tmp_path, failure,
                                                expected):
  cluster = healthy
  job, log_path = _start_long_job(
      cluster, tmp_path, [f'--failure_timeout={SHORT_FAILURE_TIMEOUT}'])
  remote = cluster.hosts[1]
  try:
    failed_at = time.monotonic()
    failure(cluster, remote)
    returncode = job.wait(timeout=SHORT_FAILURE_TIMEOUT + 30)
    took = time.monotonic() - failed_at
  finally:
    if job.poll() is None:
      job.kill()
  print(f'time to exit: {took:.1f} s')
  assert returncode != 0
  assert took < SHORT_FAILURE_TIMEOUT
  lines = open(log_path).read().strip().splitlines()
  # The port guard can say after it that it could not reach the lost host
  # to remove its rules (docs/security.md).
  last_line = [line for line in lines if 'port guard' not in line][-1]
  assert 'job failed' in last_line, last_line
  assert expected.format(address=remote.address) in last_line, last_line
  assert all(remote.address in line for line in lines
             if 'could not remove' in line)
  assert not launcher.wait_until_no_job_processes(cluster), (
      'a process of the job outlived it')


def test_a_short_outage_does_not_end_the_job(healthy, tmp_path):
  cluster = healthy
  job, log_path = _start_long_job(cluster, tmp_path)
  cluster.cut_link(cluster.hosts[1])
  time.sleep(5)  # The outage itself.
  cluster.restore_link(cluster.hosts[1])
  try:
    launcher.wait_for_line(job, log_path, 'step 8/',
                           timeout=FAILURE_TIMEOUT * 3)
  finally:
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
  output = open(log_path).read()
  assert 'job failed' not in output
  assert 'job stopped by SIGTERM' in output  # Ours, not a lost host.


def test_preflight_names_each_host_and_starts_nothing(healthy, tmp_path):
  cluster = healthy
  log_path = tmp_path / 'log.txt'
  job = launcher.start(cluster, ['--use_horovod',
                                 f'--model_dir={tmp_path / "m"}',
                                 '--batch_size=8'] + TINY, log_path,
                       env={'DOCKER_SSHD_PORT': '3023'})
  assert job.wait(timeout=60) == 2
  lines = open(log_path).read().strip().splitlines()
  for host in cluster.hosts:
    assert any(line.startswith(f'error: host {host.address}: ssh on port '
                               '3023 failed') for line in lines), lines
  assert lines[-1].startswith('error: pre-flight check failed on 2 host(s)')
  assert not (tmp_path / 'm').exists()
  assert not launcher.job_processes(cluster)


def test_dry_run_shows_the_preflight_checks(cluster, tmp_path):
  returncode, output = launcher.run(
      cluster, ['-ds', 'multi_worker_mirrored', '--dry_run',
                f'--model_dir={tmp_path}', '--batch_size=8'] + TINY,
      tmp_path / 'log.txt', timeout=60)
  assert returncode == 0, output
  address = cluster.hosts[1].address
  assert f'pre-flight on {address}: ports 2410 free' in output
  assert f'pre-flight on each of {cluster.hosts[0].address}, {address}' in \
      output


def test_a_restarted_job_ends_with_an_uninterrupted_runs_weights(
    healthy, tmp_path, horovod_run):
  cluster = healthy
  model_dir = tmp_path / 'model'
  log_path = tmp_path / 'log.txt'
  # --clean as users' job scripts give it: for the first attempt only.
  job = launcher.start(cluster, ['--use_horovod', '--num_workers_per_hls=1',
                                 '--max_restarts=1', '--clean',
                                 f'--model_dir={model_dir}']
                       + SEEDED + TINY, log_path)
  try:
    launcher.wait_for_line(job, log_path, 'ckpt-4')
    _kill_rank(cluster, cluster.hosts[1])
    assert job.wait(timeout=400) == 0, open(log_path).read()[-4000:]
  finally:
    if job.poll() is None:
      job.kill()
  output = open(log_path).read()
  restarts = [l for l in output.splitlines() if 'restart 1 of 1' in l]
  assert len(restarts) == 1 and 'killed by SIGKILL' in restarts[0], output
  before = output[:output.index(restarts[0])]
  reached = max(int(step) for step in re.findall(rf'step (\d+)/{STEPS}',
                                                 before))
  resumed = int(re.search(r'restored from \S+ at step (\d+)',
                          output).group(1))
  print(f'restart: reached step {reached}, resumed at step {resumed}: '
        f'{reached - resumed} steps lost')
  assert 4 <= resumed < STEPS  # It resumed mid-run, from a checkpoint.
  # What the launcher said it resumes from is what the trainer did.
  assert f'the job restarts on the same host(s): resuming at step {resumed}' \
      in output
  summary = runner.read_summary(str(model_dir))
  assert summary['restarts'] == 1 and summary['resumed_from_step'] == resumed
  assert summary['train_steps'] == STEPS
  uninterrupted = runner.read_summary(horovod_run[0])
  assert summary['weights_sha256'] == uninterrupted['weights_sha256']


def test_data_service_hosts_lose_a_worker_and_the_dispatcher_then_the_last(
    healthy, tmp_path):
  """--data_service_hosts h2,h1: a dispatcher on h2, data workers on h2 and
  h1, one trainer on h1. h2's worker killed: training goes on and the log
  says so; the dispatcher killed and restarted by hand from its work_dir:
  goes on; h1's worker, the last, killed: the job ends within the
  trainer's --tf_data_service_timeout, naming both hosts; no server the
  launcher started is left on either host, and the dispatcher restarted by
  hand, not the launcher's, is left running (a pattern of its command line
  stopped it too)."""
  h1, h2 = healthy.hosts
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir, num_classes=4, train_per_shard=(32, 32),
                eval_per_shard=(5, 4))
  work_dir, timeout = str(tmp_path / 'dispatcher'), 15
  args = [a for a in TINY if not a.startswith(('--use_synthetic_data',
                                               '--num_classes'))] + [
      f'--data_dir={data_dir}', '--batch_size=8', '--train_steps=1000000',
      '--train_epochs=100000', '--epochs_between_evals=100000',
      '--log_steps=2', f'--model_dir={tmp_path / "model"}',
      f'--data_service_hosts={h2.address},{h1.address}',
      f'--data_service_work_dir={work_dir}',
      f'--tf_data_service_timeout={timeout}']
  log = str(tmp_path / 'job.log')
  # One trainer, on h1: no MULTI_HLS_IPS.
  job = launcher.start(healthy, args, log, env={'MULTI_HLS_IPS': ''})
  try:
    step = launcher.wait_for_step(job, log, 10)
    text = open(log).read()
    assert (f'[data dispatcher {h2.address}] tf.data service dispatcher '
            'ready at') in text
    assert f'--tf_data_service=grpc://{h2.address}:5050' not in text  # argv
    # The servers' own command lines (arguments NUL-separated), not the
    # launcher's ssh commands that start them.
    dispatcher = 'resnet_keras.data.service\0dispatcher'
    worker = 'resnet_keras.data.service\0worker'
    assert len(healthy.processes(h2, worker)) == 1
    for pid in healthy.processes(h2, worker):
      os.kill(pid, signal.SIGKILL)
    launcher.wait_for_line(job, log, f'data worker on {h2.address} exited')
    assert 'training goes on with 1 data worker' in open(log).read()
    step = launcher.wait_for_step(job, log, step + 30)

    for pid in healthy.processes(h2, dispatcher):
      os.kill(pid, signal.SIGKILL)
    launcher.wait_for_line(job, log, f'dispatcher on {h2.address} exited')
    by_hand = healthy.popen(
        h2, [sys.executable, '-m', 'resnet_keras.data.service', 'dispatcher',
             '--port', '5050', '--work_dir', work_dir], env=dict(os.environ),
        cwd=runner.REPO_ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    step = launcher.wait_for_step(job, log, step + 30)

    for pid in healthy.processes(h1, worker):
      os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    assert job.wait(timeout=timeout + 90) == 1
    assert time.monotonic() - killed < timeout + 45
  finally:
    if job.poll() is None:
      job.kill()
  lines = open(log).read().strip().splitlines()
  assert 'no batch from the tf.data service at' in '\n'.join(lines[-6:])
  assert lines[-1].endswith(
      f'the tf.data service lost its servers on {h1.address}, {h2.address} '
      'during the job: restart them there (or drop them from '
      '--data_service_hosts) and rerun to resume')
  try:
    assert by_hand.poll() is None
    assert len(healthy.processes(h2, dispatcher)) == 1  # By hand.
    assert not healthy.processes(h2, worker)
    assert not healthy.processes(h1, 'resnet_keras.data.service')
  finally:
    by_hand.kill()
    by_hand.wait()
