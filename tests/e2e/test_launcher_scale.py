"""The launcher at many hosts, in this process, against stand-ins for ssh,
mpirun, srun and scontrol (testbed/standins.py, on PATH): the pre-flight's
ssh sessions capped, a lost host re-planned, node lists read, and a dry run
that grows by a short line per rank. benchmarks/launcher_scale.py measures
the same at 1,000 hosts; nothing here asserts a speed."""

import importlib
import json
import os
import re

import pytest

from testbed import standins
from tests.support import runner


def launch(args, env):
  return runner.call(importlib.import_module('demo_resnet_keras'), args,
                     env=env)


@pytest.fixture
def stand_ins(tmp_path):
  """The environment that puts the stand-ins first on PATH, and where
  they record what they did."""
  bin_dir, records = tmp_path / 'bin', tmp_path / 'records'
  bin_dir.mkdir()
  records.mkdir()
  standins.install(str(bin_dir))
  return {'PATH': f'{bin_dir}:{os.environ["PATH"]}',
          'STANDIN_DIR': str(records), 'STANDIN_DELAY': '0.05',
          'SLURM_JOB_ID': '', 'MULTI_HLS_IPS': ''}


def loopback_hosts(count):
  return [f'127.0.{1 + i // 250}.{1 + i % 250}' for i in range(count)]


# The launcher with the ssh sessions' cap lowered to 4, which shows at 16
# hosts what 64 does at 1,000: a process of its own, as the supervisor
# passes its job's output to its stdout.
_CAPPED_LAUNCHER = (
    'import runpy, sys\n'
    'from resnet_keras.launcher import fanout\n'
    'fanout.MAX_SESSIONS = 4\n'
    'sys.argv[0] = "demo_resnet_keras.py"\n'
    'runpy.run_path(sys.argv[0], run_name="__main__")\n')


@pytest.mark.slow  # A launcher's start and 34 stand-in processes.
def test_hosts_checked_a_few_at_a_time_and_a_lost_one_left_out(
    stand_ins, tmp_path):
  hosts = loopback_hosts(16)
  env = {**stand_ins, 'MULTI_HLS_IPS': ','.join(hosts),
         'STANDIN_LOSE': hosts[-1]}
  result = runner.spawn_script(
      '-c', [_CAPPED_LAUNCHER, '--use_horovod', '--batch_size=15',
             '--min_hosts=15', '--max_restarts=1', '--port_guard=off',
             f'--model_dir={tmp_path / "run"}'], env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  events = standins.events(stand_ins['STANDIN_DIR'])
  ssh_open = [e['open'] for e in events
              if e['kind'] == 'ssh' and e['event'] == 'start']
  assert len(ssh_open) == 16 + 16  # Every host asked at the start and again.
  assert 1 < max(ssh_open) <= 4
  starts = [e['hosts'] for e in events
            if e['kind'] == 'mpirun' and e['event'] == 'start']
  assert starts == [16, 15]
  assert f'host {hosts[-1]}: ssh on port 3022 failed' in result.stderr
  assert 'elastic: the job shrinks from 16 to 15 host(s)' in result.stderr


def dry_run_lines(env):
  result = launch(['--dry_run', '-ds', 'multi_worker_mirrored',
                   '--batch_size=560', '--model_dir=/shared/run'], env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.splitlines()


def test_a_dry_run_grows_by_a_short_line_per_rank(stand_ins):
  sizes = {}
  for count in (20, 40, 80):
    lines = dry_run_lines({**stand_ins, 'MULTI_HLS_IPS': ','.join(
        loopback_hosts(count))})
    ranks = [l for l in lines if l.startswith('TF_CONFIG rank ')]
    assert len(ranks) == count and max(map(len, ranks)) < 80
    sizes[count] = sum(len(l) + 1 for l in lines)
  # Linear: 40 more hosts add about twice what 20 more did (every rank's
  # whole TF_CONFIG would add four times as much).
  assert sizes[80] - sizes[40] < 2.5 * (sizes[40] - sizes[20])
  assert not os.listdir(stand_ins['STANDIN_DIR'])  # It asked nobody.


def test_a_slurm_node_list_is_read_and_srun_gets_it_compressed(stand_ins):
  nodelist = 'gpu[0001-0012,0600-0611],cpu[1-3,7]'
  lines = dry_run_lines({**stand_ins, 'SLURM_JOB_ID': '7',
                         'SLURM_JOB_NODELIST': nodelist})
  command = next(l for l in lines if l.startswith('command: srun '))
  assert f"'--nodelist={nodelist}'" in command and '--nodes=28' in command
  # The nodes' addresses, as the scontrol stand-in gave them, in order.
  addresses = next(l for l in lines if l.startswith('env: MULTI_HLS_IPS='))
  assert addresses.split('=', 1)[1].split(',')[-1] == '127.1.0.28'
  shared = json.loads(next(l for l in lines if l.startswith(
      'TF_CONFIG of each rank: ')).split(': ', 1)[1])
  assert len(shared['cluster']['worker']) == 28
  assert re.fullmatch(r'TF_CONFIG rank 27: task index 27, listens on '
                      r'127\.1\.0\.28:\d+', next(
                          l for l in lines if l.startswith('TF_CONFIG rank 27')))
