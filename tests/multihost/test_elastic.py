"""Elastic jobs across hosts (demo_resnet_keras.py --min_hosts) on a
three-host cluster of network namespaces, one worker per host: a host lost
for good is dropped and the job goes on with the global batch kept, a host
that answers again rejoins by itself (or, past the cap of changes, at the
next restart), and the shrunk run resumes exactly. They need root and skip
without it, saying so."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from testbed import cluster as cluster_lib
from testbed.soak import report
from testbed.soak import runner as soak
from testbed.soak import invariants as soak_invariants
from testbed.soak import plan as soak_plan
from tests.support import launcher
from tests.support import runner
from tests.support.records import write_dataset

FAILURE_TIMEOUT = 24
STEPS = 36
# Horovod: 3 workers x 4 = 12; tf.distribute: --batch_size is the global 12.
BACKENDS = {'horovod': (['--use_horovod'], 4),
            'multi_worker_mirrored': (['-ds', 'multi_worker_mirrored'], 12)}
# --clean, as users' job scripts give it, applies to the first attempt only.
ELASTIC = ['--min_hosts=2', '--max_restarts=2', '--clean',
           f'--failure_timeout={FAILURE_TIMEOUT}', '--global_seed=7',
           '--checkpoint_interval_steps=4', '--max_checkpoints=100',
           '--enable_checkpoint_and_export', f'--train_steps={STEPS}',
           '--train_epochs=1', '--num_workers_per_hls=1']

_missing = cluster_lib.missing_requirements()
# One job of this module at a time, on its cluster, in one worker: its
# jobs (this_host's too) run in the cluster's namespaces, whose ports never
# meet those of the jobs the other modules start, so the modules' chains run
# side by side (test_multi_host.py says why).
pytestmark = [pytest.mark.skipif(_missing is not None,
                                 reason=f'no test cluster: {_missing}'),
              pytest.mark.xdist_group('cluster_elastic')]
# The cluster of this module (conftest.py): its hosts, and the subnets
# 10.77.N.0/24 it may take (the other module's are apart).
CLUSTER_HOSTS = 3
CLUSTER_SUBNETS = range(20, 100)


def _kill_rank(cluster, host):
  for pid in cluster.processes(host, launcher.TRAINER):
    os.kill(pid, 9)


def _resumed_step(line):
  return int(re.search(r'resuming at step (\d+)', line).group(1))


def _line(output, text):
  found = [line for line in output.splitlines() if text in line]
  assert len(found) == 1, (text, output[-4000:])
  return found[0]


@pytest.mark.parametrize('backend', list(BACKENDS))
def test_a_lost_host_is_dropped_then_rejoins_and_the_resume_is_exact(
    healthy, tmp_path, backend):
  """h3's link cut at a third of the run: the job goes on from the last
  checkpoint on h1 and h2, each worker taking half the global batch. The
  link back, but the job's cap of one change an hour keeps h3 out; h2's
  rank killed: the next restart finds h3 again and the job ends on three
  hosts at the planned step. The steps trained on two hosts equal those of
  an uninterrupted two-host run from the same checkpoint."""
  cluster = healthy
  h1, h2, h3 = cluster.hosts
  backend_args, batch = BACKENDS[backend]
  model_dir, log = str(tmp_path / 'model'), tmp_path / 'log.txt'
  started = time.monotonic()
  job = launcher.start(cluster, backend_args + ELASTIC + [
      f'--batch_size={batch}', f'--model_dir={model_dir}',
      '--max_membership_changes_per_hour=1'] + launcher.TINY, log)
  try:
    launcher.wait_for_line(job, log, f'ckpt-{STEPS // 3}')
    cluster.cut_link(h3)
    launcher.wait_for_line(job, log, 'elastic: the job shrinks', timeout=120)
    cluster.restore_link(h3)
    shrunk_at = _resumed_step(_line(open(log).read(), 'the job shrinks'))
    launcher.wait_for_line(job, log, f'ckpt-{shrunk_at + 8}')
    _kill_rank(cluster, h2)
    assert job.wait(timeout=400) == 0, open(log).read()[-4000:]
  finally:
    if job.poll() is None:
      job.kill()
  print(f'{backend}: shrink and regrowth in {time.monotonic() - started:.0f} s')
  output = open(log).read()
  shrink = _line(output, 'the job shrinks')
  assert (f'the job shrinks from 3 to 2 host(s) ({h1.address}, {h2.address}):'
          ' 2 host(s), 2 worker(s) x batch 6 in 2 micro-batch(es) = global '
          'batch 12 (kept); resuming at step') in shrink
  assert re.search(rf'host {h3.address}: .*: left out of the job', output)
  assert 'answer again' not in output  # The cap: one change an hour.
  grow = _line(output, 'the job grows')
  assert (f'the job grows from 2 to 3 host(s) ({h1.address}, {h2.address}, '
          f'{h3.address}): 3 host(s), 3 worker(s) x batch 4 in 1 '
          'micro-batch(es) = global batch 12 (kept)') in grow
  grown_at = _resumed_step(grow)
  assert STEPS // 3 <= shrunk_at < grown_at < STEPS
  summary = runner.read_summary(model_dir)
  assert summary['train_steps'] == STEPS and summary['restarts'] == 2
  assert summary['resumed_from_step'] == grown_at
  shapes = [(s['step'], s['workers'], s['global_batch_size'],
             s['micro_batches']) for s in summary['world_sizes']]
  assert shapes == [(0, 3, 12, 1), (shrunk_at, 2, 12, 2),
                    (grown_at, 3, 12, 1)]
  assert not launcher.wait_until_no_job_processes(cluster)

  # The same two hosts from the checkpoint the shrink resumed at, without
  # a failure: the checkpoint the regrowth resumed at is the same.
  reference = str(tmp_path / 'reference')
  runner.copy_run_up_to(model_dir, shrunk_at, reference)
  two_hosts = {'MULTI_HLS_IPS': f'{h1.address},{h2.address}'}
  returncode, output = launcher.run(
      cluster, backend_args + [a for a in ELASTIC
                               if a != '--clean' and 'min_hosts' not in a] + [
          f'--batch_size={6 if backend == "horovod" else 12}',
          '--num_accumulation_steps=2', f'--model_dir={reference}']
      + launcher.TINY, tmp_path / 'reference.txt', env=two_hosts)
  assert returncode == 0, output[-4000:]
  # The runs saved different numbers of checkpoints: not their counters.
  shrunk, uninterrupted = (
      runner.checkpoint_values(
          os.path.join(d, f'ckpt-{grown_at}'),
          lambda name: not name.startswith('save_counter'))
      for d in (model_dir, reference))
  assert shrunk.keys() == uninterrupted.keys()
  for name, value in shrunk.items():
    np.testing.assert_array_equal(value, uninterrupted[name], err_msg=name)


def test_fewer_hosts_than_min_hosts_end_the_job_in_one_line(healthy,
                                                            tmp_path):
  cluster = healthy
  _, h2, h3 = cluster.hosts
  log = tmp_path / 'log.txt'
  job = launcher.start(cluster, ['--use_horovod', '--batch_size=4',
                                 f'--model_dir={tmp_path / "m"}'] + [
                                     a for a in ELASTIC
                                     if not a.startswith('--train_steps')] +
                       ['--train_steps=100000'] + launcher.TINY, log)
  try:
    launcher.wait_for_line(job, log, 'step 2/')
    cut = time.monotonic()
    cluster.cut_link(h2)
    cluster.cut_link(h3)
    returncode = job.wait(timeout=FAILURE_TIMEOUT + 90)
    took = time.monotonic() - cut
  finally:
    if job.poll() is None:
      job.kill()
  print(f'fewer than --min_hosts: ended {took:.0f} s after the cut')
  assert returncode != 0
  assert took < FAILURE_TIMEOUT + 60
  # The port guard's line on the hosts it could not reach comes after.
  last = [line for line in open(log).read().strip().splitlines()
          if 'port guard' not in line][-1]
  assert (f'only 1 of 3 hosts pass the pre-flight check '
          f'({cluster.hosts[0].address}), fewer than --min_hosts=2; the job '
          'ends') in last, last
  assert not launcher.wait_until_no_job_processes(cluster)


def test_a_count_that_cannot_keep_the_batch_is_refused_before_anything_runs(
    cluster, tmp_path):
  returncode, output = launcher.run(
      cluster, ['--use_horovod', '--batch_size=3', '--min_hosts=2',
                f'--model_dir={tmp_path / "m"}'] + launcher.TINY,
      tmp_path / 'log.txt', timeout=120)
  assert returncode == 2
  assert output.strip().splitlines()[-1] == (
      'error: the global batch of 9 cannot be split evenly over the workers '
      'of 2 host(s), which --min_hosts=2 allows; host counts that keep it: '
      '1, 3: raise --min_hosts, change the batch, or pass '
      '--elastic_batch=scale to keep each worker\'s batch instead')
  assert not (tmp_path / 'm').exists()


def test_scale_leaves_out_a_lost_host_then_takes_it_back_by_itself(healthy,
                                                                  tmp_path):
  """h3 cut at the start: the job starts on h1 and h2, each worker keeping
  its batch (the learning rate x2/3). h3's link back once the job has a
  checkpoint: without a failure or a restart, the workers save at the next
  step and the job grows back to three hosts, the planned batch and
  learning rate. Stopped by SIGTERM once it trained on three."""
  cluster = healthy
  h1, h2, h3 = cluster.hosts
  cluster.cut_link(h3)
  model_dir, log = str(tmp_path / 'm'), tmp_path / 'log.txt'
  job = launcher.start(
      cluster, ['--use_horovod', '--batch_size=3', '--min_hosts=2',
                '--elastic_batch=scale', '--train_steps=100000',
                '--train_epochs=1', '--checkpoint_interval_steps=4',
                '--enable_checkpoint_and_export',
                f'--model_dir={model_dir}'] + launcher.TINY, log)
  try:
    launcher.wait_for_line(job, log, 'ckpt-4')
    cluster.restore_link(h3)
    answered = time.monotonic()
    launcher.wait_for_line(job, log, 'the job grows')
    grown_at = _resumed_step(_line(open(log).read(), 'the job grows'))
    launcher.wait_for_step(job, log, grown_at + 2)
    print(f'h3 back to its first step in the job: '
          f'{time.monotonic() - answered:.0f} s')
  finally:
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
  output = open(log).read()
  assert re.search(rf'host {h3.address}: .*: left out of the job', output)
  assert (f'the job shrinks from 3 to 2 host(s) ({h1.address}, '
          f'{h2.address}): 2 host(s), 2 worker(s) x batch 3 in 1 '
          'micro-batch(es) = global batch 6, learning rate x0.6667 '
          '(--elastic_batch=scale); from step 0') in output
  assert (f'elastic: host(s) {h3.address} answer again: the workers save at '
          'the next step and stop, and the job restarts with it') in output
  assert (f'the job grows from 2 to 3 host(s) ({h1.address}, {h2.address}, '
          f'{h3.address}): 3 host(s), 3 worker(s) x batch 3 in 1 '
          'micro-batch(es) = global batch 9 (kept); resuming at step '
          f'{grown_at};') in output
  assert grown_at >= 4
  # Saved once at the step it grew at: a stop at a step saved writes none.
  assert len(re.findall(rf'saved checkpoint at step {grown_at}\b',
                        output)) == 1, output[-4000:]
  assert not re.search(r'job failed|restart \d', output), output[-4000:]
  assert 'job stopped by SIGTERM' in output
  with open(os.path.join(model_dir, 'world_sizes.json')) as f:
    shapes = [(s['step'], s['workers'], s['global_batch_size'],
               round(s['lr_scale'], 4)) for s in json.load(f)]
  assert shapes == [(0, 2, 6, 0.6667), (grown_at, 3, 9, 1.0)]
  assert not launcher.wait_until_no_job_processes(cluster)


def test_a_restart_restarts_lost_data_servers_and_leaves_out_a_lost_host(
    healthy, tmp_path):
  """--data_service_hosts h2,h3 (the dispatcher on h2, a data worker on
  each) for one trainer on h1: h2's dispatcher and data worker killed,
  h3's link cut, the trainer killed: the restart starts h2's servers again
  (the dispatcher from its journal), leaves h3's data worker out, and the
  job ends at its planned step."""
  h1, h2, h3 = healthy.hosts
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir, num_classes=4, train_per_shard=(32, 32),
                eval_per_shard=(5, 4))
  model_dir = str(tmp_path / 'model')
  args = [a for a in launcher.TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes'))] + [
          f'--data_dir={data_dir}', '--batch_size=8', '--train_epochs=4',
          '--epochs_between_evals=4', '--checkpoint_interval_steps=4',
          '--enable_checkpoint_and_export', '--max_restarts=1',
          f'--model_dir={model_dir}',
          f'--data_service_hosts={h2.address},{h3.address}',
          f'--data_service_work_dir={tmp_path / "dispatcher"}',
          '--tf_data_service_timeout=60']
  log = tmp_path / 'log.txt'
  job = launcher.start(healthy, args, log, env={'MULTI_HLS_IPS': ''})
  try:
    launcher.wait_for_line(job, log, 'ckpt-8')
    for role in ('dispatcher', 'worker'):
      for pid in healthy.processes(h2, f'resnet_keras.data.service\0{role}'):
        os.kill(pid, 9)
      name = 'dispatcher' if role == 'dispatcher' else 'data worker'
      launcher.wait_for_line(job, log, f'{name} on {h2.address} exited')
    healthy.cut_link(h3)
    _kill_rank(healthy, h1)
    assert job.wait(timeout=400) == 0, open(log).read()[-4000:]
  finally:
    if job.poll() is None:
      job.kill()
  output = open(log).read()
  for line in (f'restarted the tf.data service dispatcher on {h2.address}',
               f'restarted the tf.data service worker on {h2.address}',
               f'the tf.data service data worker on {h3.address} is left '
               'out: its host fails the pre-flight check'):
    assert line in output, output[-4000:]
  summary = runner.read_summary(model_dir)
  # 4 epochs of 64 examples in batches of 8.
  assert summary['train_steps'] == 32 and summary['restarts'] == 1
  assert summary['tf_data_service']['data_workers'] == 1
  for host in (h1, h2):
    assert not healthy.processes(host, 'resnet_keras.data.service')


_PROBE = '''
import socket, sys
for target in sys.argv[1:]:
  host, port = target.rsplit(':', 1)
  try:
    socket.create_connection((host, int(port)), timeout=3).close()
    print(target, 'connected')
  except OSError as e:
    print(target, type(e).__name__)
'''


def _listening(cluster, host):
  """The TCP ports `host` listens on for other hosts (not its sshd)."""
  out = subprocess.run(cluster.enter(host) + ['ss', '-Hltn'], check=True,
                       capture_output=True, text=True).stdout
  ports = set()
  for line in out.splitlines():
    address, port = line.split()[3].rsplit(':', 1)
    if not address.startswith(('127.', '[::1]')) and int(port) != 3022:
      ports.add(int(port))
  return sorted(ports)


def _probe(cluster, source, targets):
  """target -> 'connected', or the error a connection from `source` met."""
  out = subprocess.run(cluster.enter(source) + [sys.executable, '-c', _PROBE]
                       + targets, check=True, capture_output=True,
                       text=True).stdout
  return dict(line.rsplit(' ', 1) for line in out.splitlines())


def _chains(cluster, host):
  return [line for tool in ('iptables', 'ip6tables')
          for line in subprocess.run(
              cluster.enter(host) + [tool, '-S'], check=True,
              capture_output=True, text=True).stdout.splitlines()
          if 'RESNET_KERAS' in line]


@pytest.mark.parametrize('guard', ['auto', 'off'])
def test_a_host_outside_the_job_cannot_reach_its_ports(healthy, tmp_path,
                                                       guard):
  """multi_worker_mirrored on h1 and h2 (the launcher on h1): while it
  trains, h3, outside the job, gets its connections to every port the job
  listens on (TensorFlow's, OpenMPI's) reset, and h1 and h2 reach each
  other's; with --port_guard=off h3 connects to the worker's port, as it
  would to any server of TensorFlow's. After the job no rule is left."""
  cluster = healthy
  h1, h2, h3 = cluster.hosts
  log = tmp_path / 'log.txt'
  started = time.monotonic()
  job = launcher.start(
      cluster, ['-ds', 'multi_worker_mirrored', '--num_workers_per_hls=1',
                '--batch_size=8', '--train_steps=100000', '--train_epochs=1',
                f'--port_guard={guard}', f'--model_dir={tmp_path / "m"}']
      + launcher.TINY, log, env={'MULTI_HLS_IPS': f'{h1.address},{h2.address}'})
  try:
    launcher.wait_for_line(job, log, 'step 2/')
    ports = {host.name: _listening(cluster, host) for host in (h1, h2)}
    print(f'--port_guard={guard}: listening', ports)
    assert 2410 in ports[h1.name] and 2410 in ports[h2.name]
    targets = {host.name: [f'{host.address}:{port}'
                           for port in ports[host.name]] for host in (h1, h2)}
    outsider = _probe(cluster, h3, targets[h1.name] + targets[h2.name])
    if guard == 'off':
      assert outsider[f'{h2.address}:2410'] == 'connected'
      assert not _chains(cluster, h1) and not _chains(cluster, h2)
    else:
      assert set(outsider.values()) == {'ConnectionRefusedError'}, outsider
      for source, target in ((h1, h2), (h2, h1)):
        assert _probe(cluster, source, targets[target.name]) == {
            t: 'connected' for t in targets[target.name]}
  finally:
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
  print(f'--port_guard={guard}: {time.monotonic() - started:.0f} s')
  output = open(log).read()
  guard_lines = [l for l in output.splitlines() if 'port guard' in l]
  assert len(guard_lines) == 1, guard_lines
  if guard == 'auto':
    assert (f'closed to all but the job\'s hosts and loopback on {h1.address},'
            f' {h2.address} (iptables chain RESNET_KERAS_') in guard_lines[0]
  else:
    assert 'port guard: off (--port_guard=off): ports 2410, ' in \
        guard_lines[0]
  assert 'job stopped by SIGTERM' in output
  assert not _chains(cluster, h1) and not _chains(cluster, h2)
  assert not launcher.wait_until_no_job_processes(cluster)


# The fault soak's CI tier (testbed/soak/, docs/testing.md): its first
# jobs for a fixed seed on this host and over ssh, 16 steps each, each held
# to an uninterrupted run of its layout (the weights invariant); the long
# soak is a benchmark.
SOAK_SEED = 2


@pytest.mark.parametrize('plan', soak_plan.draw_plan(
    SOAK_SEED, 2, ('this_host', 'ssh'), soak_plan.BACKENDS, steps=(16,)),
                         ids=lambda plan: f'{plan.placement}-{plan.fault}')
def test_a_soak_job_keeps_every_invariant(healthy, tmp_path, plan):
  started = time.monotonic()
  record = soak.Soak(healthy, work_dir=str(tmp_path)).run_job(plan)
  print(report.HEADER, report.row(record), sep='\n')
  print(f'{time.monotonic() - started:.0f} s')
  assert record.reference_weights, record.reference_error  # Compared.
  assert record.outcome in soak_invariants.ENDED_WELL, record.last_line
  assert soak_invariants.broken_invariants(record) == []
