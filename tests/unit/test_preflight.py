"""Pre-flight checks of a multi-host launch, against fake hosts.

The real thing (ssh into namespace hosts) runs in
multihost/test_multi_host.py; here the same checks run through a local
stand-in for ssh, which runs the probe on this machine as if it were the
remote host.
"""

import os
import stat
import sys

from resnet_keras.launcher import preflight

WANT = preflight.Expected(python=sys.executable, python_version='3.11.7',
                          tensorflow='2.20.0', horovod='0.28.1',
                          script='/repo/resnet_ctl_imagenet_main.py')
GOOD = {'python': '3.11.7', 'tensorflow': '2.20.0', 'horovod': '0.28.1',
        'project': True, 'busy_ports': []}


def test_a_ready_host_has_no_problems():
  assert preflight.problems_of('h2', GOOD, WANT) == []


def test_each_difference_is_one_line_naming_the_host_and_the_fix():
  answer = {'python': '3.10.1', 'tensorflow': None, 'horovod': '0.27.0',
            'project': False, 'busy_ports': [2410]}
  problems = preflight.problems_of('h2', answer, WANT)
  assert len(problems) == 5
  assert all(line.startswith('host h2: ') for line in problems)
  assert 'Python 3.10.1, not 3.11.7' in problems[0]
  assert 'TensorFlow is not installed, not 2.20.0' in problems[1]
  assert 'Horovod 0.27.0, not 0.28.1' in problems[2]
  assert 'same path on every host' in problems[3]
  assert 'port(s) 2410 in use' in problems[4]


def test_horovod_is_not_checked_for_tf_distribute_jobs():
  want = preflight.Expected(**{**WANT.__dict__, 'horovod': None})
  assert preflight.problems_of('h2', {**GOOD, 'horovod': None}, want) == []


def test_ssh_is_openmpis_rsh_agent_when_set():
  assert preflight.ssh_command({}, '3022')[:3] == ['ssh', '-p', '3022']
  assert preflight.ssh_command(
      {'OMPI_MCA_plm_rsh_agent': 'ssh -F /x/config'}, '4022')[:5] == [
          'ssh', '-F', '/x/config', '-p', '4022']


def test_tf_config_ports_per_host():
  assert preflight.ports_by_host(['a:2410', 'a:2411', 'b:2410', 'b:2411']) == {
      'a': [2410, 2411], 'b': [2410, 2411]}


def _fake_ssh(tmp_path, body):
  """An 'ssh' that runs its command here (sh -c), or does `body`."""
  path = tmp_path / 'fake_ssh'
  path.write_text('#!/bin/sh\n' + body)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return [str(path)]


def test_the_probe_runs_on_each_host_and_reports_what_it_has(tmp_path):
  # Drops ssh's options and the host name, then runs the remote command.
  ssh = _fake_ssh(tmp_path, 'while [ "$#" -gt 1 ]; do shift; done\n'
                            'exec sh -c "$1"\n')
  script = os.path.abspath(__file__)
  want = preflight.expected(script, use_horovod=False)
  report = preflight.check(['h1', 'h2'], ssh, want, {}, '3022')
  assert report.problems == []
  # Both "hosts" answered from this machine: their workers share its cores.
  assert report.hosts_per_machine == 2
  missing = preflight.Expected(**{**want.__dict__,
                                  'script': str(tmp_path / 'nothing.py')})
  problems = preflight.check(['h1', 'h2'], ssh, missing, {}, '3022').problems
  assert [p.split(':')[0] for p in problems] == ['host h1', 'host h2']


def test_an_unreachable_host_is_named_with_sshs_reason(tmp_path):
  ssh = _fake_ssh(tmp_path, 'echo "connect to host h2 port 3022: '
                            'Connection refused" >&2; exit 255\n')
  want = preflight.expected(os.path.abspath(__file__), use_horovod=False)
  report = preflight.check(['h2'], ssh, want, {}, '3022')
  assert report.hosts_per_machine == 1
  assert report.problems == ['host h2: ssh on port 3022 failed (connect to host h2 '
                      'port 3022: Connection refused): start sshd there on '
                      'DOCKER_SSHD_PORT and authorise this host\'s key']
  assert report.ready == ()


def test_a_host_that_cannot_be_reached_at_all_is_told_apart(tmp_path):
  ssh = _fake_ssh(tmp_path, 'echo "ssh: connect to host h3 port 3022: '
                            'Connection timed out" >&2; exit 255\n')
  want = preflight.expected(os.path.abspath(__file__), use_horovod=False)
  report = preflight.check(['h3'], ssh, want, {}, '3022')
  assert report.problems[0].endswith('Connection timed out): check the host '
                                     'is up and reachable from here')


def test_describe_lists_the_checks():
  lines = preflight.describe(['a', 'b'], ['ssh', '-p', '3022'], WANT,
                             {'a': [2410], 'b': [2410]})
  assert lines[0].startswith(
      'pre-flight on each of a, b: ssh -p 3022 -- HOST')
  assert 'TensorFlow 2.20.0 and Horovod 0.28.1' in lines[0]
  assert lines[1:] == ['pre-flight on a: ports 2410 free',
                       'pre-flight on b: ports 2410 free']
