"""demo_resnet_keras.py as users run it, through its main in this process
(support/runner.py; --dry_run contacts nobody and starts nothing):
presets, dry-run commands and launch errors."""

import importlib
import json
import os
import platform
import shlex
import subprocess
import sys

import pytest

from resnet_keras.launcher import commands as launch_lib
from resnet_keras.launcher import slurm
from tests.support import runner


def launch(args, env=None):
  return runner.call(importlib.import_module('demo_resnet_keras'), args,
                     env=env)


def dry_run(args, env=None):
  result = launch(['--dry_run'] + args, env=env)
  assert result.returncode == 0, result.stderr
  return result.stdout


def command_of(output):
  line = next(l for l in output.splitlines() if l.startswith('command: '))
  return shlex.split(line[len('command: '):])


def trainer_args(argv):
  return argv[argv.index(runner.MAIN) + 1:]


def values_of(args, name):
  """Every value `args` gives flag `name`, in any absl spelling."""
  values = []
  for i, arg in enumerate(args):
    if arg in (f'--{name}', f'-{name}'):
      values.append(args[i + 1] if i + 1 < len(args) and
                    not args[i + 1].startswith('-') else 'true')
    elif arg.startswith((f'--{name}=', f'-{name}=')):
      values.append(arg.split('=', 1)[1])
    elif arg == f'--no{name}':
      values.append('false')
  return values


def test_lars_preset_for_one_worker():
  args = trainer_args(command_of(dry_run(['--optimizer', 'LARS'])))
  assert values_of(args, 'base_learning_rate') == ['2.5']
  assert values_of(args, 'warmup_epochs') == ['3']
  assert values_of(args, 'lr_schedule') == ['polynomial']
  assert values_of(args, 'label_smoothing') == ['0.1']
  assert values_of(args, 'weight_decay') == ['0.0001']
  assert values_of(args, 'single_l2_loss_op') == ['true']


def test_rmsprop_has_no_preset():
  args = trainer_args(command_of(dry_run(['--optimizer', 'RMSProp'])))
  for name in ('base_learning_rate', 'warmup_epochs', 'lr_schedule',
               'weight_decay'):
    assert values_of(args, name) == [], name


@pytest.mark.parametrize('given,name,value', [
    (['--base_learning_rate=3'], 'base_learning_rate', '3'),
    (['--base_learning_rate', '3'], 'base_learning_rate', '3'),
    (['-base_learning_rate=3'], 'base_learning_rate', '3'),
    (['--warmup_epochs', '1'], 'warmup_epochs', '1'),
    (['--nosingle_l2_loss_op'], 'single_l2_loss_op', 'false'),
    (['--single_l2_loss_op=false'], 'single_l2_loss_op', 'false'),
])
def test_a_value_the_user_gave_wins_in_every_spelling(given, name, value):
  args = trainer_args(command_of(dry_run(['--optimizer=LARS'] + given)))
  assert values_of(args, name) == [value], args


def test_multi_worker_horovod_uses_mpirun_and_the_large_batch_lr():
  out = dry_run(['--optimizer', 'LARS', '--use_horovod',
                 '--num_workers_per_hls', '2', '-bs', '8'])
  argv = command_of(out)
  # As root (mpirun refuses root without it) or not: unit/test_launcher.py.
  as_root = ['--allow-run-as-root'] if os.geteuid() == 0 else []
  assert argv[:3 + len(as_root)] == ['mpirun', *as_root, '-np', '2']
  assert '--tag-output' in argv and '--merge-stderr-to-stdout' in argv
  args = trainer_args(argv)
  assert values_of(args, 'base_learning_rate') == ['9.5']
  assert '--use_horovod' in args and '--num_workers_per_hls' not in out
  # Every rank gets oneDNN as the launcher set it, and why (common/env.py).
  forwarded = [argv[i + 1] for i, a in enumerate(argv) if a == '-x']
  assert {'TF_ENABLE_ONEDNN_OPTS', 'RESNET_KERAS_ONEDNN_DEFAULTED'} <= set(
      forwarded) or platform.machine().lower() not in ('x86_64', 'amd64')


def test_in_a_slurm_allocation_the_preset_counts_its_nodes():
  # 3 nodes x 1 worker: the several-workers LARS rate, and srun, not mpirun.
  out = dry_run(['--optimizer', 'LARS', '-ds', 'multi_worker_mirrored',
                 '-bs', '12'], env={'SLURM_JOB_ID': '5',
                                    'SLURM_JOB_NODELIST': 'n[1-3]'})
  argv = command_of(out)
  assert argv[:3] == ['srun', '--nodes=3', '--nodelist=n[1-3]']
  assert values_of(trainer_args(argv), 'base_learning_rate') == ['9.5']


# Outside any allocation, whatever the environment the tests run in.
NO_ALLOCATION = {'SLURM_JOB_ID': '', 'MULTI_HLS_IPS': ''}


def test_a_value_that_spells_a_launcher_flag_stays_the_trainers():
  args = trainer_args(command_of(dry_run(['--model_dir', '--dry_run'])))
  assert values_of(args, 'model_dir') == ['--dry_run']


def test_a_batch_scripts_command_finds_the_users_relative_paths(
    tmp_path, monkeypatch):
  """The script cds into the checkout: what the user gave relative to where
  the launcher ran (a recipe file, --model_dir, --data_dir in a flagfile,
  the flagfile itself) still names the user's files from there."""
  (tmp_path / 'my.yaml').write_text('batch_size: 6\n')
  (tmp_path / 'data').mkdir()
  (tmp_path / 'runs' / 'x').mkdir(parents=True)
  (tmp_path / 'flags.txt').write_text('--data_dir=data\n--max_restarts=1\n')
  monkeypatch.chdir(tmp_path)
  result = launch(['--dry_run', '--launcher=slurm', '--config', 'my.yaml',
                   '--model_dir', 'runs/x', '--flagfile', 'flags.txt'],
                  env=NO_ALLOCATION)
  assert result.returncode == 0, result.stderr
  cd, command = result.stdout.splitlines()[-2:]
  assert cd == f'cd {shlex.quote(runner.REPO_ROOT)}'
  # The job runs the command from the checkout, in its allocation.
  monkeypatch.chdir(runner.REPO_ROOT)
  launcher_args = shlex.split(command)[3:]
  assert launcher_args[-1] == '--launcher=slurm'
  out = dry_run(launcher_args, env={'SLURM_JOB_ID': '5',
                                    'SLURM_JOB_NODELIST': 'n1'})
  args = trainer_args(command_of(out))
  assert values_of(args, 'batch_size') == ['6']  # my.yaml was read.
  for name, path in (('model_dir', 'runs/x'), ('data_dir', 'data')):
    assert os.path.samefile(values_of(args, name)[0], tmp_path / path)
  # The flagfile's launcher flag is the launcher's, not the trainer's.
  assert not values_of(args, 'max_restarts')


def test_outside_an_allocation_a_slurm_dry_run_prints_a_batch_script():
  args = ['--dry_run', '--launcher=slurm', '--slurm_nodes=3',
          '--num_workers_per_hls=2', '-ds', 'multi_worker_mirrored',
          '-bs', '12', '--optimizer', 'LARS', '-md', '/shared/my runs']
  result = launch(args, env=NO_ALLOCATION)
  assert result.returncode == 0, result.stderr
  script = result.stdout
  directives = [l for l in script.splitlines() if l.startswith('#SBATCH')]
  cpus = max(1, launch_lib.physical_core_count() // 2)
  assert directives == [
      '#SBATCH --job-name=resnet_keras', '#SBATCH --nodes=3',
      '#SBATCH --ntasks-per-node=2', f'#SBATCH --cpus-per-task={cpus}',
      '#SBATCH --signal=USR1@120', '#SBATCH --requeue',
      '#SBATCH --open-mode=append', '#SBATCH --output=resnet_keras-%j.out']
  assert script.splitlines()[0] == '#!/bin/bash'
  assert f'cd {shlex.quote(runner.REPO_ROOT)}' in script.splitlines()
  assert shlex.split(script.splitlines()[-1]) == [
      'exec', sys.executable, 'demo_resnet_keras.py',
      '--num_workers_per_hls=2', '-ds=multi_worker_mirrored', '-bs=12',
      '--optimizer=LARS', '-md=/shared/my runs', '--launcher=slurm']
  syntax = subprocess.run(['bash', '-n'], input=script, text=True,
                          capture_output=True, check=False)
  assert syntax.returncode == 0, syntax.stderr
  # MULTI_HLS_IPS's hosts are the nodes by default; the script leaves the
  # variable out (Slurm gives the nodes).
  hosts = {**NO_ALLOCATION, 'MULTI_HLS_IPS': '192.0.2.1,192.0.2.2'}
  script = launch(['--dry_run', '--launcher', 'slurm', '-ds',
                   'multi_worker_mirrored'], env=hosts).stdout
  assert '#SBATCH --nodes=2' in script and '192.0.2.1' not in script
  # The flags are checked for the workers the script asks for.
  runner.assert_one_line_error(launch(args[:6] + ['-bs', '8'],
                                      env=NO_ALLOCATION),
                               'must be a multiple of the 6 workers')
  runner.assert_one_line_error(
      launch(args[1:], env=NO_ALLOCATION),
      '--slurm_nodes=3 sets the nodes of the batch script')
  runner.assert_one_line_error(
      launch(['--launcher=slurm', '-md', '/shared/r'], env=NO_ALLOCATION),
      '--launcher=slurm runs inside a Slurm allocation', 'sbatch')


def _no_scontrol(nodes):
  raise AssertionError(f'scontrol asked about {nodes}')


@pytest.mark.parametrize('args,env', [
    (['--launcher=slurm'], NO_ALLOCATION),  # The batch script.
    ([], {'SLURM_JOB_ID': '7', 'SLURM_JOB_NODELIST': 's[1-2]'}),
    (['--launcher=slurm'], {'SLURM_JOB_ID': '7',
                            'SLURM_JOB_NODELIST': 's[1-2]'}),
])
def test_under_slurm_the_data_service_hosts_are_refused_in_one_line(
    args, env, monkeypatch):
  # Refused before the nodes' addresses are asked of scontrol.
  monkeypatch.setattr(slurm, 'node_addresses', _no_scontrol)
  result = launch(['--dry_run', '--data_service_hosts', 'h2'] + args, env=env)
  runner.assert_one_line_error(
      result, '--data_service_hosts starts the tf.data service over ssh',
      'python -m resnet_keras.data.service', '--tf_data_service',
      '--launcher=ssh')


def test_multi_host_dry_run_contacts_nobody_and_prints_tf_configs():
  env = {'MULTI_HLS_IPS': '192.0.2.1,192.0.2.2', 'TF_BASE_PORT': '7000'}
  out = dry_run(['-ds', 'multi_worker_mirrored', '--num_workers_per_hls', '2',
                 '--horovod_hierarchical_allreduce'], env=env)
  argv = command_of(out)
  assert argv[argv.index('-np') + 1] == '4'
  hostfile = argv[argv.index('--hostfile') + 1]
  assert not os.path.exists(hostfile)  # A dry run writes nothing.
  assert '192.0.2.1 slots=2' in out and '192.0.2.2 slots=2' in out
  assert 'env: HOROVOD_HIERARCHICAL_ALLREDUCE=1' in out
  assert '-x' in argv and 'MULTI_HLS_IPS' in argv
  # The cluster the ranks share once, then each rank's own part.
  shared, = [json.loads(l.split(': ', 1)[1]) for l in out.splitlines()
             if l.startswith('TF_CONFIG of each rank: ')]
  assert shared['cluster']['worker'][3] == '192.0.2.2:7001'
  assert shared['task'] == {'type': 'worker', 'index': 'RANK'}
  ranks = [l for l in out.splitlines() if l.startswith('TF_CONFIG rank')]
  assert ranks[3] == 'TF_CONFIG rank 3: task index 3, listens on 192.0.2.2:7001'
  assert len(ranks) == 4


def test_data_service_hosts_dry_run_shows_the_servers_and_contacts_nobody():
  out = dry_run(['--data_service_hosts', '192.0.2.5,192.0.2.6',
                 '--data_service_port', '6000'])
  args = trainer_args(command_of(out))
  assert values_of(args, 'tf_data_service') == ['grpc://192.0.2.5:6000']
  assert values_of(args, 'tf_data_service_workers') == ['2']
  assert not any('data_service_hosts' in a for a in args)
  servers = [l for l in out.splitlines() if l.startswith('data service ')]
  assert [l.split(':')[0] for l in servers] == [
      'data service dispatcher on 192.0.2.5', 'data service worker on 192.0.2.5',
      'data service worker on 192.0.2.6']
  assert '-m resnet_keras.data.service worker --port 6001 --dispatcher ' \
         '192.0.2.5:6000' in servers[2]
  assert 'pre-flight on 192.0.2.5: ports 6000, 6001 free' in out
  result = launch(['--dry_run', '--data_service_hosts', 'h2',
                   '--tf_data_service', 'grpc://h3:1'])
  runner.assert_one_line_error(result, 'give one of them')


def test_kubernetes_run_starts_this_rank_in_process():
  out = dry_run(['--use_horovod', '--num_workers_per_hls', '8',
                 '--kubernetes_run=True'])
  argv = command_of(out)
  assert argv[1] == runner.MAIN and 'mpirun' not in argv
  assert not any('kubernetes_run' in a for a in argv)
  # =False is a real false: several workers go back to mpirun.
  out = dry_run(['--use_horovod', '--num_workers_per_hls', '8',
                 '--kubernetes_run=False'])
  assert command_of(out)[0] == 'mpirun'


@pytest.mark.parametrize('args,fragments', [
    (['--num_workers_per_hls', '2'], ['2 workers need a multi-worker backend',
                                      '--use_horovod']),
    (['--use_horovod', '-ds', 'mirrored'], ['--use_horovod and',
                                           'use one']),
    (['-ds', 'hpu'], ['hpu is Gaudi-only', 'multi_worker_mirrored']),
    (['--optimizer', 'Adam'], ['--optimizer=Adam is not supported']),
    (['--num_workers_per_hls', '0'],
     ['--num_workers_per_hls must be in [1, 1024]']),
    (['-ds', 'multi_worker_mirrored', '--num_workers_per_hls', '4', '-bs', '2'],
     ['--batch_size=2 is the global batch', 'multiple of the 4 workers',
      '--batch_size=4']),
    (['--no_such_flag'], ['no_such_flag']),
])
def test_launch_errors_are_one_line(args, fragments):
  result = launch(['--dry_run'] + args)
  runner.assert_one_line_error(result, *fragments)


def test_elastic_dry_run_shows_the_split_on_each_host_count_it_allows():
  env = {'MULTI_HLS_IPS': '192.0.2.1,192.0.2.2,192.0.2.3'}
  out = dry_run(['--use_horovod', '-bs', '4', '--num_accumulation_steps', '2',
                 '--min_hosts', '1'], env=env)
  # 3 x 4 in micro-batches of 2: 12 on 2 hosts is 6 each in 3, on 1 is 12
  # in 6.
  assert ('elastic: on 2 host(s), 2 worker(s) x batch 6 in 3 micro-batch(es)'
          ' = global batch 12: --batch_size=6 --num_accumulation_steps=3'
          ) in out
  assert ('elastic: on 1 host(s), 1 worker(s) x batch 12 in 6 micro-batch(es)'
          ' = global batch 12: --batch_size=12 --num_accumulation_steps=6'
          ) in out
  assert '--min_hosts' not in command_of(out)  # The launcher's own flag.
  result = launch(['--dry_run', '--use_horovod', '--min_hosts', '4'],
                  env=env)
  runner.assert_one_line_error(result, '--min_hosts=4 is more than the 3 '
                               'hosts of MULTI_HLS_IPS')


def test_multi_host_needs_a_multi_worker_backend():
  result = launch(['--dry_run'], env={'MULTI_HLS_IPS': '192.0.2.1,192.0.2.2'})
  runner.assert_one_line_error(result, '2 workers need a multi-worker backend')


def test_missing_mpirun_says_how_to_install_it(tmp_path):
  result = launch(['--use_horovod', '--num_workers_per_hls=2',
                   f'--model_dir={tmp_path}'], env={'PATH': str(tmp_path)})
  runner.assert_one_line_error(result, 'mpirun not found', 'install_horovod.sh')


def test_dry_run_shows_the_port_guard_and_on_fails_in_one_line(tmp_path):
  args = ['-ds', 'multi_worker_mirrored', '--num_workers_per_hls=2',
          '--batch_size=8', f'--model_dir={tmp_path}']
  result = launch(['--dry_run', '--port_guard=off'] + args)
  assert result.returncode == 0, result.stderr
  assert ('port guard: off (--port_guard=off): ports 2410-2411, 2510-2577 '
          'listen on every interface without authentication') in result.stderr
  assert 'port guard on' not in result.stdout
  # Inside a Slurm allocation the guard cannot remove its rules reliably.
  slurm_env = {'SLURM_JOB_ID': '7', 'SLURM_JOB_NODELIST': 'n1'}
  result = launch(['--dry_run', '--port_guard=on', '--launcher=slurm']
                  + args, env=slurm_env)
  runner.assert_one_line_error(result, '--port_guard=on: not applied under '
                               'Slurm', '--port_guard=auto')


def test_clean_of_a_foreign_directory_stops_the_launch_before_any_host(
    tmp_path):
  (tmp_path / 'thesis.txt').write_text('mine')
  # Hosts that run no sshd: the launch stops before asking them anything.
  result = launch(['--use_horovod', '--clean', f'--model_dir={tmp_path}'],
                  env={'MULTI_HLS_IPS': '127.0.0.2,127.0.0.3'})
  assert result.returncode == 2
  runner.assert_one_line_error(result, '--clean', 'thesis.txt',
                               'nothing was removed')
  assert (tmp_path / 'thesis.txt').read_text() == 'mine'


def test_a_launch_of_several_workers_needs_a_model_dir():
  result = launch(['--use_horovod'],
                  env={'MULTI_HLS_IPS': '127.0.0.2,127.0.0.3'})
  runner.assert_one_line_error(result, 'needs --model_dir')
