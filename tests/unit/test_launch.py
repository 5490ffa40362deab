"""mpirun commands, TF_CONFIG and flag stripping, as pure functions."""

import json
import subprocess

import pytest

from resnet_keras.launcher import commands as launch
from common.errors import UsageError

PROGRAM = ['python', 'resnet_ctl_imagenet_main.py', '-bs', '8']


def _mpirun(**overrides):
  kwargs = dict(workers_per_host=2, hosts=[], physical_cores=8,
                environ={'PATH': '/bin'}, hostfile_path='/tmp/hosts',
                as_root=True)
  kwargs.update(overrides)
  return launch.mpirun_command(PROGRAM, **kwargs)


def test_single_host_binds_each_worker_to_its_share_of_cores():
  plan = _mpirun(workers_per_host=4, physical_cores=56)
  argv = ' '.join(plan.argv)
  assert argv.startswith('mpirun --allow-run-as-root -np 4 --bind-to core '
                         '--map-by socket:PE=14 --tag-output '
                         '--merge-stderr-to-stdout')
  assert argv.endswith(' '.join(PROGRAM))
  assert '--hostfile' not in argv and '--oversubscribe' not in argv
  assert plan.files == {} and plan.notes == []


def test_only_root_gets_allow_run_as_root():
  assert _mpirun(as_root=False).argv[:3] == ['mpirun', '-np', '2']
  assert _mpirun(as_root=True).argv[:2] == ['mpirun', '--allow-run-as-root']


def test_more_workers_than_cores_oversubscribes_without_binding():
  plan = _mpirun(workers_per_host=4, physical_cores=2)
  assert plan.argv[4:7] == ['--bind-to', 'none', '--oversubscribe']
  assert '4 workers per host but 2 physical cores' in plan.notes[0]


def test_multi_host_writes_a_hostfile_and_uses_the_ssh_port():
  plan = _mpirun(hosts=['10.0.0.1', '10.0.0.2'], workers_per_host=8,
                 physical_cores=16,
                 environ={'DOCKER_SSHD_PORT': '4022', 'MPI_ROOT': '/opt/mpi',
                          'MPI_TCP_INCLUDE': '10.0.0.0/24'})
  argv = ' '.join(plan.argv)
  assert '-np 16 ' in argv
  assert plan.files == {'/tmp/hosts': '10.0.0.1 slots=8\n10.0.0.2 slots=8\n'}
  assert '--hostfile /tmp/hosts --mca plm_rsh_args -p4022' in argv
  assert ('--mca btl_tcp_if_include 10.0.0.0/24 '
          '--mca oob_tcp_if_include 10.0.0.0/24') in argv
  assert '--prefix /opt/mpi' in argv
  default = ' '.join(_mpirun(hosts=['a', 'b']).argv)
  assert f'-p{launch.DEFAULT_SSH_PORT}' in default


def test_only_relevant_set_variables_are_forwarded():
  environ = {'PATH': '/bin', 'PYTHONPATH': '/x', 'TF_CONFIG': '{}',
             'HOROVOD_FUSION_THRESHOLD': '1', 'NCCL_DEBUG': 'INFO',
             'HOME': '/root', 'SECRET_TOKEN': 'x'}
  plan = _mpirun(environ=environ, extra_env={'HOROVOD_CYCLE_TIME': '1'})
  forwarded = [plan.argv[i + 1] for i, a in enumerate(plan.argv) if a == '-x']
  # And what the supervisor tells each attempt (set as it runs mpirun).
  assert forwarded == ['HOROVOD_CYCLE_TIME', 'HOROVOD_FUSION_THRESHOLD',
                       'NCCL_DEBUG', 'PATH', 'PYTHONPATH',
                       'RESNET_KERAS_RESTARTS', 'RESNET_KERAS_RESUME_STEP',
                       'TF_CONFIG']
  assert plan.env == {'HOROVOD_CYCLE_TIME': '1'}


def test_tf_config_follows_mpirun_placement():
  config = launch.tf_config_for_rank(3, 4, ['h1', 'h2'], base_port=5000)
  assert config == {'cluster': {'worker': ['h1:5000', 'h1:5001', 'h2:5000',
                                           'h2:5001']},
                    'task': {'type': 'worker', 'index': 3}}
  local = launch.tf_config_for_rank(0, 2, [])
  assert local['cluster']['worker'] == ['localhost:2410', 'localhost:2411']
  with pytest.raises(UsageError, match='spread evenly'):
    launch.tf_config_for_rank(0, 3, ['h1', 'h2'])


@pytest.mark.parametrize('environ,expected_rank', [
    ({'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2'}, 1),
    ({'PMI_RANK': '0', 'PMI_SIZE': '2', 'TF_BASE_PORT': '3000'}, 0),
])
def test_tf_config_from_the_mpi_environment(environ, expected_rank):
  config = json.loads(launch.tf_config_from_mpi(environ))
  assert config['task']['index'] == expected_rank
  port = int(environ.get('TF_BASE_PORT', 2410))
  assert config['cluster']['worker'] == [f'localhost:{port}',
                                         f'localhost:{port + 1}']


def test_no_tf_config_outside_mpi():
  assert launch.tf_config_from_mpi({'PATH': '/bin'}) is None


def test_hosts_parsing():
  assert launch.parse_hosts(None) == []
  assert launch.parse_hosts(' a, b ,') == ['a', 'b']
  with pytest.raises(UsageError, match='lists a host twice'):
    launch.parse_hosts('a,a')


def test_strip_flags_in_every_spelling():
  args = ['--num_workers_per_hls', '8', '-bs', '4', '--num_workers_per_hls=2',
          '--kubernetes_run=True', '--nokubernetes_run', '--dry_run',
          '-kubernetes_run', '--use_horovod', '--base_learning_rate=3']
  assert launch.strip_flags(args, ('kubernetes_run', 'dry_run'),
                            ('num_workers_per_hls',)) == [
                                '-bs', '4', '--use_horovod',
                                '--base_learning_rate=3']


def test_physical_cores_is_positive():
  assert launch.physical_core_count() >= 1


def test_keepalive_ends_a_lost_hosts_job_within_the_failure_timeout():
  args = launch.keepalive_args(60)
  values = dict(zip(args[1::3], map(int, args[2::3])))
  assert values == {'oob_tcp_keepalive_time': 15,
                    'oob_tcp_keepalive_intvl': 5,
                    'oob_tcp_keepalive_probes': 3}
  # Idle time plus every probe, with time to spare for the shutdown.
  assert (values['oob_tcp_keepalive_time'] + values['oob_tcp_keepalive_intvl']
          * values['oob_tcp_keepalive_probes']) <= 60 // 2
  assert ' '.join(args) in ' '.join(_mpirun(failure_timeout=60).argv)
  with pytest.raises(UsageError, match='at least 12 seconds'):
    launch.keepalive_args(5)


def test_failure_env_per_backend():
  assert launch.failure_env(60, use_horovod=True) == {
      'HOROVOD_STALL_CHECK_TIME_SECONDS': '60',
      'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '600'}
  environ = launch.failure_env(60, use_horovod=False)
  assert launch.collective_timeout(environ) == 600.0
  assert launch.collective_timeout({}) is None
  with pytest.raises(UsageError, match='not a number of seconds'):
    launch.collective_timeout({launch.COLLECTIVE_TIMEOUT_VAR: 'soon'})


def test_this_host_names_the_address_on_the_jobs_network():
  record = launch.this_host({'MULTI_HLS_IPS': '127.0.0.1,127.0.0.2'})
  assert record['address'] == '127.0.0.1' and record['hostname']
  assert launch.this_host({})['address'] == ''


def test_hosts_on_one_machine_are_not_bound_to_the_same_cores():
  # Two namespace hosts or containers of one 2-core machine: each host's
  # daemon would bind its first rank to core 0.
  plan = _mpirun(hosts=['a', 'b'], workers_per_host=1, physical_cores=2,
                 hosts_per_machine=2)
  argv = ' '.join(plan.argv)
  assert '--bind-to none' in argv and '--bind-to core' not in argv
  assert 'mpi_yield_when_idle' not in argv  # 2 workers, 2 cores.
  assert plan.notes == ['2 hosts share one machine: not binding workers to '
                        'cores']
  # 4 workers on 2 cores: ranks waiting in a collective must yield the CPU.
  argv = ' '.join(_mpirun(hosts=['a', 'b'], workers_per_host=2,
                          physical_cores=2, hosts_per_machine=2).argv)
  assert '--mca mpi_yield_when_idle 1' in argv


def test_data_service_servers_start_and_stop_over_ssh():
  servers = launch.data_service_servers(
      ['h2', 'h3'], ['ssh', '-p', '3022'], '/py/bin/python3', '/repo dir',
      5050, '/tmp/journal')
  assert [(s.host, s.role, s.port) for s in servers] == [
      ('h2', 'dispatcher', 5050), ('h2', 'worker', 5051),
      ('h3', 'worker', 5051)]
  dispatcher, _, worker = servers
  # '--': a host is never read as one of ssh's options.
  assert dispatcher.argv[:5] == ['ssh', '-p', '3022', '--', 'h2']
  assert dispatcher.argv[5] == (
      "cd '/repo dir' && exec /py/bin/python3 -m resnet_keras.data.service "
      'dispatcher --port 5050 --work_dir /tmp/journal')
  assert worker.argv[5].endswith('worker --port 5051 --dispatcher h2:5050')
  # Stopped by its own command line, anchored at both ends, this user's.
  stop = worker.stop_argv[5]
  assert worker.stop_argv[:5] == ['ssh', '-p', '3022', '--', 'h3']
  pattern = ("'^/py/bin/python3 -m resnet_keras\\.data\\.service worker "
             "--port 5051( |$)'")
  assert stop.startswith(f'pkill -U "$(id -u)" -f {pattern};')
  assert stop.endswith(f'pkill -KILL -U "$(id -u)" -f {pattern}')
  assert launch.data_service_address(['h2', 'h3'], 5050) == 'grpc://h2:5050'


def test_a_server_is_matched_by_its_whole_command_line_only():
  pattern = launch.server_pattern(
      ['/py 3/python3.11', '-m', 'resnet_keras.data.service', 'worker',
       '--port', '5051'])
  lines = [
      '/py 3/python3.11 -m resnet_keras.data.service worker --port 5051',
      '/py 3/python3.11 -m resnet_keras.data.service worker --port 5051 '
      '--dispatcher h2:5050',
      # Another job's server, one on another interpreter, and the shell
      # that runs pkill: none of them.
      '/py 3/python3.11 -m resnet_keras.data.service worker --port 50510',
      '/py 3/python3x11 -m resnet_keras.data.service worker --port 5051',
      f"bash -c pkill -f '{pattern}'"]
  # pgrep's own regular expressions (POSIX extended), through grep -E.
  matched = subprocess.run(['grep', '-E', pattern], input='\n'.join(lines),
                           capture_output=True, text=True).stdout
  assert matched.splitlines() == lines[:2]


@pytest.mark.parametrize('host', ['n1', 'node-7.cluster.local', 'r1_n2',
                                  '10.0.0.1', 'fe80::1', '2001:db8::2'])
def test_host_names_and_addresses_are_hosts(host):
  assert launch.parse_hosts(f'h0,{host}') == ['h0', host]


@pytest.mark.parametrize('host', ['-oProxyCommand=touch x', '-p1', 'a b',
                                  'h;id', '$(id)', 'h`id`', "h'", 'h\n1',
                                  'h/1', 'h:22'])
def test_anything_else_is_refused_naming_where_it_came_from(host):
  with pytest.raises(UsageError, match='^MULTI_HLS_IPS: .* is not a host '
                                       'name or an IP address'):
    launch.parse_hosts(f'h0,{host}')


@pytest.mark.parametrize('value,workers', [('abc', 1), ('0', 1), ('-5', 1),
                                           ('99999', 1), ('65535', 2)])
def test_a_base_port_out_of_range_is_refused(value, workers):
  with pytest.raises(UsageError, match=f'^TF_BASE_PORT={value}: .* give a '
                                       'port number from 1 to'):
    launch.tf_base_port({'TF_BASE_PORT': value}, workers)


def test_the_base_port_and_the_ports_above_it_fit():
  assert launch.tf_base_port({}, 8) == launch.DEFAULT_TF_BASE_PORT
  assert launch.tf_base_port({'TF_BASE_PORT': '65534'}, 2) == 65534
