"""The launcher's commands (mpirun, the tf.data service's servers) and flag
stripping, as pure functions."""

import subprocess
import time

import psutil
import pytest

from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import input_servers
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
                       'NCCL_DEBUG', 'PATH', 'PYTHONPATH', 'RESNET_KERAS_JOB',
                       'RESNET_KERAS_RESTARTS', 'RESNET_KERAS_RESUME_STEP',
                       'TF_CONFIG']
  assert plan.env == {'HOROVOD_CYCLE_TIME': '1'}


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
  # The remote shell reports its PID, which exec hands to the server.
  assert dispatcher.argv[5].startswith(
      "cd '/repo dir' && echo \"resnet_keras data server: pid $$ ")
  assert dispatcher.argv[5].endswith(
      '&& exec /py/bin/python3 -m resnet_keras.data.service dispatcher '
      '--port 5050 --work_dir /tmp/journal')
  assert worker.argv[5].endswith('worker --port 5051 --dispatcher h2:5050')
  stop = worker.stop_argv('4242', '987')
  assert stop[:5] == ['ssh', '-p', '3022', '--', 'h3']
  assert stop[5].startswith('p=4242; t=987; ')
  assert launch.data_service_address(['h2', 'h3'], 5050) == 'grpc://h2:5050'
  assert launch.read_pid_line('resnet_keras data server: pid 12 345') == (
      '12', '345')
  for other in ('resnet_keras data server: pid 12', 'ready at x',
                'resnet_keras data server: pid 1;x 2'):
    assert launch.read_pid_line(other) is None


def test_ipv6_data_service_hosts_are_bracketed_where_a_port_follows():
  servers = launch.data_service_servers(
      ['fd00::2', 'fd00::3'], ['ssh'], 'python3', '/repo', 5050, '/j')
  assert servers[2].argv[:3] == ['ssh', '--', 'fd00::3']  # ssh's own form
  assert servers[2].argv[3].endswith("--dispatcher '[fd00::2]:5050'")
  assert launch.data_service_address(['fd00::2'], 5050) == (
      'grpc://[fd00::2]:5050')


def _stand_ins(folder, server):
  """An ssh that runs the command apart from its own process, as a host
  does (ending the session leaves the server running there), and a
  `python` whose server is the shell script `server`."""
  ssh, python = folder / 'ssh', folder / 'python'
  ssh.write_text('#!/bin/sh\nwhile [ "$1" != -- ]; do shift; done\n'
                 '/bin/sh -c "$3" &\nwait\n')
  python.write_text('#!/bin/sh\n' + server)
  for script in (ssh, python):
    script.chmod(0o755)
  return str(ssh), str(python)


def test_a_server_that_cannot_start_is_the_launchers_one_line(tmp_path):
  ssh, python = _stand_ins(tmp_path, 'echo "error: the tf.data service '
                           'dispatcher cannot listen on port 5050"; exit 2\n')
  servers = launch.data_service_servers(['h2'], [ssh], python,
                                        str(tmp_path), 5050, '/j')
  with pytest.raises(UsageError, match='^the tf.data service dispatcher on '
                     'h2 did not start \\(exited: the tf.data service '
                     'dispatcher cannot listen on port 5050\\); nothing else '
                     'was started$'):
    input_servers.DataServers(servers, print).start(timeout=30)


def test_a_server_is_stopped_by_the_pid_it_reported_and_only_that(tmp_path):
  """Another job's server with the very same command line (a pattern of
  it matched both, as root any user's) is left running."""
  ssh, python = _stand_ins(tmp_path, 'echo "tf.data service server ready '
                           'at x"\nexec sleep 600\n')
  servers = launch.data_service_servers(['h2'], [ssh], python,
                                        str(tmp_path), 5050, '/j')
  other_job = subprocess.Popen(['/bin/sh', '-c', servers[1].argv[-1]],
                               stdout=subprocess.PIPE, text=True)
  running, pids = input_servers.DataServers(servers, print), []
  try:
    running.start(timeout=30)
    pids = [int(pid) for pid, _ in running._pids]  # pylint: disable=protected-access
    # Each says it is ready just before it execs its serving part.
    deadline = time.monotonic() + 30
    while not all(psutil.Process(pid).cmdline() == ['sleep', '600']
                  for pid in pids + [other_job.pid]):
      assert time.monotonic() < deadline
      time.sleep(0.05)
  finally:
    running.stop()
    try:
      assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                     != psutil.STATUS_ZOMBIE for pid in pids)
      assert other_job.poll() is None
    finally:
      other_job.kill()
      other_job.communicate()
