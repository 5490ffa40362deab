"""Who writes a run directory and what in it is the run's
(resnet_keras/rundir/ownership.py), without TensorFlow: the lock against a
second writer in this process and in another, a dead holder taken over, another
host's lock judged by its renewal, a job's own attempts, the record of what
a run wrote, and --clean removing that and nothing else."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from common import worker_contract
from common.errors import UsageError
from resnet_keras.rundir import ownership
from resnet_keras.rundir import run_lock
from tests.support import runner


def _write(path, text='x'):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _lock_record(run, **holder):
  record = {'program': 'old', 'host': socket.gethostname(), 'pid': 1, 'since': time.time(),
            'job': None, **holder}
  _write(os.path.join(run, 'run.lock'), json.dumps(record))


def _one_line(raised, *fragments):
  message = str(raised.value)
  assert '\n' not in message
  for fragment in fragments:
    assert fragment in message, message


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
  run = str(tmp_path / 'run')
  with ownership.take(run, 'first'):
    with pytest.raises(UsageError) as raised:
      ownership.take(run, 'second')
    _one_line(raised, f'--model_dir={run} is in use by first',
              f'pid {os.getpid()}', 'since 20', 'one writer at a time')
  # Let go: the next takes it, and no lock is left behind.
  assert not os.path.exists(os.path.join(run, 'run.lock'))
  ownership.take(run, 'second').release()
  # Nothing written: nothing of the runs' left, not even the directory.
  assert not os.path.exists(run)


def test_a_writer_in_another_process_is_refused(tmp_path):
  run = str(tmp_path / 'run')
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time\n'
       'from resnet_keras.rundir import ownership\n'
       f'ownership.take({run!r}, "trainer")\n'
       'print("held", flush=True)\n'
       'time.sleep(60)'],
      cwd=runner.REPO_ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == 'held\n'
    with pytest.raises(UsageError) as raised:
      ownership.take(run, 'second')
    _one_line(raised, f'in use by trainer (pid {holder.pid} on ')
    # Killed with -9: its lock file stays, its flock goes with it.
    holder.kill()
    holder.wait()
    assert os.path.exists(os.path.join(run, 'run.lock'))
    ownership.take(run, 'second').release()
  finally:
    holder.kill()


def test_a_dead_holders_lock_is_taken_over_and_what_it_wrote_is_the_runs(
    tmp_path, monkeypatch):
  monkeypatch.setattr(ownership, '_CLOCK_SLACK', 0)
  said = []
  monkeypatch.setattr(ownership.logging, 'info',
                      lambda message, *args: said.append(message % args))
  run = str(tmp_path / 'run')
  with ownership.take(run, 'first'):
    _write(os.path.join(run, 'config.json'))
    _write(os.path.join(run, 'train', 'events.1'))
  _write(os.path.join(run, 'train', 'mine.txt'))  # a user's, before
  time.sleep(0.05)  # past the file times' granularity
  since = time.time()
  _lock_record(run, pid=2**22 + 12345, since=since)  # no process holds it
  _write(os.path.join(run, 'ckpt-4.index'))  # the dead run's last write
  with ownership.take(run, 'second') as owner:
    assert f'{run}: taken over from old (pid {2**22 + 12345} on ' in said[0]
    assert owner.clean() == ['ckpt-4.index', 'config.json', 'train/']
  assert sorted(os.listdir(run)) == ['run_files.txt', 'train']
  assert os.listdir(os.path.join(run, 'train')) == ['mine.txt']


def test_another_hosts_lock_is_live_while_it_is_renewed(tmp_path):
  run = str(tmp_path / 'run')
  os.makedirs(run)
  _lock_record(run, host='elsewhere')
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'second')
  _one_line(raised, 'pid 1 on elsewhere', 'renewed 0 s ago')
  stale = time.time() - run_lock.STALE_SECONDS - 1
  os.utime(os.path.join(run, 'run.lock'), (stale, stale))
  ownership.take(run, 'second').release()


def test_an_attempt_takes_over_from_its_jobs_earlier_one(tmp_path):
  run = str(tmp_path / 'run')
  job = {worker_contract.JOB_VAR: 'launcher-7'}
  earlier = ownership.take(run, 'trainer', environ=job)
  try:
    with pytest.raises(UsageError):
      ownership.take(run, 'trainer', environ={})
    with pytest.raises(UsageError):
      ownership.take(run, 'trainer',
                     environ={worker_contract.JOB_VAR: 'another'})
    later = ownership.take(run, 'trainer', environ=job)
    # The earlier one, ending late, leaves the later one's lock alone.
    earlier.release()
    with pytest.raises(UsageError):
      ownership.take(run, 'second')
    later.release()
  finally:
    earlier.release()


def test_a_slurm_jobs_requeues_are_one_job():
  slurm = {'SLURM_JOB_ID': '42'}
  assert worker_contract.job_identity(slurm) == 'slurm-42'
  assert worker_contract.new_job_identity(slurm) == 'slurm-42'
  assert worker_contract.job_identity({}) is None
  launched = worker_contract.attempt_env(1, 4, 'h-1-2')
  assert worker_contract.job_identity(launched) == 'h-1-2'


def test_a_directory_no_run_wrote_is_refused_and_left_alone(tmp_path):
  user = tmp_path / 'user'
  _write(str(user / 'config.json'), '{"mine": 1}')
  (user / 'saved_model').mkdir()
  for new_run in (True, False):
    with pytest.raises(UsageError) as raised:
      ownership.take(str(user), 'trainer', new_run=new_run)
    _one_line(raised, 'holds what no run wrote (config.json, saved_model/)')
  assert sorted(os.listdir(user)) == ['config.json', 'saved_model']
  with pytest.raises(UsageError):
    ownership.take(str(tmp_path / 'empty'), 'validate', new_run=False)


def test_an_earlier_versions_run_is_adopted_by_its_names(tmp_path):
  run = str(tmp_path / 'run')
  _write(os.path.join(run, 'config.json'),
         json.dumps({'config': {}, 'training_plan': {}}))
  _write(os.path.join(run, 'ckpt-2.index'))
  _write(os.path.join(run, 'plots', 'loss.png'))
  _write(os.path.join(run, 'thesis.txt'))
  with ownership.take(run, 'trainer') as owner:
    with pytest.raises(UsageError) as raised:
      owner.clean()
    _one_line(raised, 'holds what no run wrote (thesis.txt)',
              'nothing was removed')
    os.rename(os.path.join(run, 'thesis.txt'), tmp_path / 'thesis.txt')
    assert owner.clean() == ['ckpt-2.index', 'config.json', 'plots/']


def test_links_and_paths_outside_are_refused_before_anything(tmp_path):
  run = str(tmp_path / 'run')
  with ownership.take(run, 'trainer'):
    _write(os.path.join(run, 'config.json'))
  os.symlink(tmp_path, os.path.join(run, 'train'))
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, f'{run}/train is a symbolic link (to {tmp_path})')
  os.remove(os.path.join(run, 'train'))
  _write(os.path.join(run, 'checkpoint'),
         'model_checkpoint_path: "../other/ckpt-3"\n')
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, 'names', '../other/ckpt-3', 'outside')
  os.remove(os.path.join(run, 'checkpoint'))
  _write(str(tmp_path / 'metrics.jsonl'))
  os.link(tmp_path / 'metrics.jsonl', os.path.join(run, 'metrics.jsonl'))
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, 'metrics.jsonl has 2 names')
  os.symlink(tmp_path, os.path.join(run, 'run.lock.link'))
  os.rename(os.path.join(run, 'run.lock.link'), os.path.join(run, 'run.lock'))
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, 'run.lock is a symbolic link')


def test_clean_removes_what_the_run_wrote_and_nothing_else(tmp_path):
  run = str(tmp_path / 'run')
  with ownership.take(run, 'trainer') as owner:
    for name in ('config.json', 'ckpt-4.index', 'train/events.1',
                 'exports/ckpt-4/saved_model/saved_model.pb', 'plots/a.png'):
      _write(os.path.join(run, name))
    owner.note_written()
  for name in ('train/notes.txt', 'exports/mine/model.pb', 'plots/a.png.bak'):
    _write(os.path.join(run, name), 'mine')
  ownership.check_cleanable(run)  # a user's file in a run's folder: fine
  with ownership.for_training(run, clean=True, environ={}) as owner:
    assert sorted(os.listdir(run)) == ['exports', 'plots', 'run.lock',
                                       'run_files.txt', 'train']
  kept = sorted(os.path.relpath(os.path.join(d, f), run)
                for d, _, names in os.walk(run) for f in names)
  assert kept == ['exports/mine/model.pb', 'plots/a.png.bak', 'run_files.txt',
                  'train/notes.txt']
  # A restart of the job resumes: --clean is for its first attempt.
  _write(os.path.join(run, 'ckpt-8.index'))
  ownership.take(run, 'trainer').release()
  with ownership.for_training(run, clean=True,
                              environ={worker_contract.RESTARTS_VAR: '1'}):
    assert os.path.exists(os.path.join(run, 'ckpt-8.index'))


def test_a_tools_output_is_new_or_its_own(tmp_path):
  never = lambda path: False
  ownership.check_new_or_own(str(tmp_path / 'new'), '--output_dir', never)
  ownership.check_new_or_own(str(tmp_path), '--output_dir', never)
  _write(str(tmp_path / 'run' / 'config.json'))
  with pytest.raises(UsageError) as raised:
    ownership.check_new_or_own(str(tmp_path / 'run'), '--output_dir', never)
  _one_line(raised, 'holds what this tool did not write there (config.json')
  ownership.check_new_or_own(str(tmp_path / 'run'), '--output_dir',
                             lambda path: True)
  with pytest.raises(UsageError) as raised:
    ownership.check_new_or_own(str(tmp_path / 'run' / 'config.json'),
                               '--output_dir', never)
  _one_line(raised, 'config.json is a file')


def test_damaged_lock_and_record_files(tmp_path):
  run = str(tmp_path / 'run')
  with ownership.take(run, 'trainer') as owner:
    _write(os.path.join(run, 'config.json'))
  # A lock file of garbage nobody holds (a write cut short): taken.
  _write(os.path.join(run, 'run.lock'), '\0\0{not json')
  with open(os.path.join(run, 'run_files.txt'), 'a') as f:
    f.write('"plots/a.p')  # a line cut short by a crash
  with ownership.take(run, 'trainer') as owner:
    assert owner.clean() == ['config.json']
  assert os.listdir(run) == []  # nothing of a run's left: nor its record
  os.mkdir(os.path.join(run, 'run_files.txt'))
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, 'run_files.txt is not a file')


@pytest.mark.parametrize('link', ['config.json', 'metrics.jsonl', 'worker_1',
                                  'train/events.1'])
def test_a_link_anywhere_is_refused(tmp_path, link):
  run = str(tmp_path / 'run')
  with ownership.take(run, 'trainer'):
    _write(os.path.join(run, 'train', 'events.0'))
  os.symlink(tmp_path, os.path.join(run, link))
  with pytest.raises(UsageError) as raised:
    ownership.take(run, 'trainer')
  _one_line(raised, f'{link} is a symbolic link')
  # The directory itself may be reached through one: it is the user's.
  os.remove(os.path.join(run, link))
  os.symlink(run, tmp_path / 'alias')
  ownership.take(str(tmp_path / 'alias'), 'trainer').release()


def test_who_holds_a_directory_is_seen_without_taking_it(tmp_path):
  run = str(tmp_path / 'run')
  assert run_lock.holder_of(run) is None
  with ownership.take(run, 'trainer',
                      environ={worker_contract.JOB_VAR: 'job-1'}):
    seen = run_lock.holder_of(run)
    assert (seen.program, seen.pid, seen.job) == ('trainer', os.getpid(),
                                                  'job-1')
    run_lock.check_free(run, {worker_contract.JOB_VAR: 'job-1'})
    with pytest.raises(UsageError) as raised:
      run_lock.check_free(run, {})
    _one_line(raised, 'is in use by trainer')
    # Looking took nothing: the holder still holds it alone.
    with pytest.raises(UsageError):
      ownership.take(run, 'second')
  _write(os.path.join(run, 'config.json'))
  _lock_record(run, pid=2**22 + 1)  # a dead holder's file: free
  assert run_lock.holder_of(run) is None
  _lock_record(run, host='elsewhere')
  assert run_lock.holder_of(run).host == 'elsewhere'
