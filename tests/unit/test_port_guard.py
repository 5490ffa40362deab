"""The port guard (launcher/port_guard.py): the ports of a job, what each
--port_guard mode decides on each placement, the rules added and removed
and the launcher's lines. Nothing here needs root."""

import signal

import pytest

from resnet_keras.launcher import commands as launch
from common.errors import UsageError
from resnet_keras.launcher import port_guard
from resnet_keras.launcher import port_rules
from resnet_keras.launcher.kubeflow import Kubeflow
from resnet_keras.launcher.slurm import Slurm


@pytest.mark.parametrize('ports,ranges,text', [
    ([2411, 2410, 5050, 2412, 5051], ((2410, 2412), (5050, 5051)),
     '2410-2412, 5050-5051'),
    ([2410, 2410], ((2410, 2410),), '2410'),
])
def test_port_ranges(ports, ranges, text):
  assert port_rules.port_ranges(ports) == ranges
  assert port_guard.describe_ports(ports) == text


def _server(host, port):
  return launch.DataServer(host=host, role='worker', port=port, argv=[],
                           ssh=())


def test_job_ports_by_host():
  mpi = port_guard.mpi_range(2410)
  assert mpi == (2510, 2577)
  assert port_guard.job_ports(['h1', 'h2'], [2410, 2411], mpi,
                              [_server('h2', 5050), _server('h3', 5051)]) == {
      'h1': [2410, 2411] + list(range(2510, 2578)),
      'h2': [2410, 2411] + list(range(2510, 2578)) + [5050],
      'h3': [5051]}
  # This host's workers, one process: nothing of the job listens.
  assert port_guard.job_ports([], [], None, []) == {}
  assert port_guard.job_ports([], [2410, 2411], None, []) == {
      port_guard.THIS_HOST: [2410, 2411]}


def test_mpi_env_pins_openmpis_daemons_and_transport():
  # mpirun takes every free port of its range: the ranks get others.
  assert port_guard.mpi_env((2510, 2577)) == {
      'OMPI_MCA_oob_tcp_dynamic_ipv4_ports': '2510-2513',
      'OMPI_MCA_oob_tcp_dynamic_ipv6_ports': '2510-2513',
      'OMPI_MCA_btl_tcp_port_min_v4': '2514',
      'OMPI_MCA_btl_tcp_port_range_v4': '64'}


@pytest.mark.parametrize('mode,kind,refused,root,iptables,why', [
    ('auto', 'this_host', '', True, True, ''),
    # The hosts say for themselves.
    ('auto', 'ssh_hosts', '', False, False, ''),
    ('auto', 'this_host', '', False, True, 'not applied (not root)'),
    ('auto', 'this_host', '', True, False, 'not applied (no iptables on this '
     'host)'),
    ('auto', Slurm.guard_kind, Slurm.guard_refused, True, True,
     'not applied under Slurm'),
    ('auto', Kubeflow.guard_kind, Kubeflow.guard_refused, True, True,
     'not applied under Kubernetes'),
    ('off', 'this_host', '', True, True, 'off (--port_guard=off)'),
])
def test_cannot(mode, kind, refused, root, iptables, why):
  said = port_guard.cannot(mode, kind, refused, root, iptables)
  assert said.startswith(why)
  assert bool(why) == bool(said)


def _for_job(mode, refused='', root=True, tf_ports=(2410, 2411)):
  return port_guard.for_job(mode, 'this_host', refused, [], list(tf_ports),
                            None, [], ['ssh'], is_root=root,
                            has_iptables=True)


def test_for_job_on_this_host_closes_its_ports_to_all_but_loopback():
  guard, line = _for_job('auto')
  assert line == '' and guard.ports == [2410, 2411]
  rules = guard.rules[port_guard.THIS_HOST]
  assert rules.sources == () and rules.ports == ((2410, 2411),)
  assert guard.argv(port_guard.THIS_HOST, 'x') == ['sh', '-c', 'x']


def test_for_job_says_why_not_and_on_fails_in_one_line():
  guard, line = _for_job('auto', root=False)
  assert guard is None
  assert line == ('port guard: not applied (not root): ports 2410-2411 '
                  'listen on every interface without authentication; run on '
                  'a private network (docs/security.md)')
  with pytest.raises(UsageError, match=r'^--port_guard=on: not applied under '
                     r'Slurm .*: run where it can \(docs/security.md\), '
                     r'or use --port_guard=auto$'):
    _for_job('on', refused=Slurm.guard_refused)
  assert _for_job('on', tf_ports=()) == (None, '')  # Nothing listens.


def test_for_job_on_ssh_hosts_lets_the_hosts_and_the_launcher_in():
  servers = [_server('127.0.0.3', 5051)]
  guard, _ = port_guard.for_job('auto', 'ssh_hosts', '', ['127.0.0.2'],
                                [2410], None, servers, ['ssh', '-p', '22'],
                                True, True)
  assert set(guard.rules) == {'127.0.0.2', '127.0.0.3'}
  assert guard.rules['127.0.0.3'].sources == ('127.0.0.2', '127.0.0.3',
                                              '127.0.0.1')
  assert guard.argv('127.0.0.2', 'x') == ['ssh', '-p', '22', '--', '127.0.0.2',
                                           'x']


def test_ipv6_hosts_are_let_in_by_ip6tables_and_the_launchers_address():
  # A job on IPv6 hosts: the launcher's own address on the route to them
  # is an IPv6 one (it was a socket.gaierror: an IPv4 socket asked).
  guard, _ = port_guard.for_job('auto', 'ssh_hosts', '', ['::1'], [2410],
                                None, [], ['ssh'], True, True)
  assert guard.rules['::1'].sources == ('::1',)
  add6 = port_rules.add_commands(guard.rules['::1'], port_rules.IPV6)
  assert ['ip6tables', '-w', '-A', guard.chain, '-s', '::1', '-j',
          'RETURN'] in add6
  assert not any('::1' in c for c in port_rules.add_commands(
      guard.rules['::1'], port_rules.IPV4))
  assert 'command -v ip6tables' in port_rules.add_script(guard.rules['::1'])


def test_an_unknown_host_name_is_one_line():
  with pytest.raises(UsageError, match='^host no-such-host.invalid: no '
                     'address found'):
    port_guard.resolve(['no-such-host.invalid'])


def _guard_with(failed):
  guard = port_guard.Guard({'h1': [2410], 'h2': [2410]}, (), ['ssh'],
                           chain='RESNET_KERAS_1_x')
  guard.applied = [h for h in ('h1', 'h2') if h not in failed]
  return guard


def test_outcome_lines():
  line, complete = port_guard.outcome(_guard_with({}), {}, 'auto')
  assert complete and line == (
      'port guard: ports 2410 closed to all but the job\'s hosts and loopback '
      'on h1, h2 (iptables chain RESNET_KERAS_1_x, removed at the end; '
      '--port_guard=off leaves them open)')
  line, complete = port_guard.outcome(_guard_with({'h2'}),
                                      {'h2': 'not root'}, 'auto')
  assert not complete and line.endswith('; NOT on h2: not root')
  line, _ = port_guard.outcome(_guard_with({'h1', 'h2'}),
                               {'h1': 'not root', 'h2': 'not root'}, 'auto')
  assert line.startswith('port guard: not applied (h1: not root; h2: not '
                         'root): ports 2410 listen on every interface')
  with pytest.raises(UsageError, match=r'^--port_guard=on: cannot close the '
                     r'job\'s ports on h2 \(no iptables\); nothing was '
                     'started'):
    port_guard.outcome(_guard_with({'h2'}), {'h2': 'no iptables'}, 'on')


def test_dry_run_lines_show_the_script_once_for_the_hosts_that_share_it():
  guard = port_guard.Guard({'h1': [2410], 'h2': [2410], 'h3': [5050]},
                           ('10.0.0.1',), ['ssh'], chain='RESNET_KERAS_1_x')
  shared, own = guard.lines()
  assert shared.startswith('port guard on each of h1, h2: ssh -- HOST ')
  assert own.startswith('port guard on h3: ssh -- h3 ')
  assert '5050:5050' in own and '5050' not in shared
  assert shared.count('-s 10.0.0.1') == 1


class _Recorded(port_guard.Guard):
  """A guard whose hosts are this process: it records what it would run."""

  def __init__(self, fail_add=False):
    super().__init__({'h1': [2410]}, (), ['ssh'], chain='RESNET_KERAS_1_x')
    self.ran, self._fail_add = [], fail_add

  def _run(self, host, script, timeout=None):
    self.ran.append('add' if script.startswith('[') else 'remove')
    return 'no iptables' if self._fail_add else None


def test_closed_removes_the_rules_after_an_error_and_restores_sigterm():
  guard = _Recorded()
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(RuntimeError):
    with port_guard.closed(guard, 'auto'):
      assert signal.getsignal(signal.SIGTERM) is not before
      raise RuntimeError('the job failed')
  assert guard.ran == ['add', 'remove'] and guard.applied == []
  assert signal.getsignal(signal.SIGTERM) is before


def test_closed_ends_the_launch_at_sigterm_through_the_removal():
  guard = _Recorded()
  with pytest.raises(SystemExit) as stopped:
    with port_guard.closed(guard, 'auto'):
      signal.raise_signal(signal.SIGTERM)
  assert stopped.value.code == 128 + signal.SIGTERM
  assert guard.ran == ['add', 'remove']


def test_closed_with_on_fails_before_the_job_where_a_host_cannot():
  guard = _Recorded(fail_add=True)
  ran = []
  with pytest.raises(UsageError, match='cannot close the job\'s ports on h1'):
    with port_guard.closed(guard, 'on'):
      ran.append('job')
  assert not ran and guard.ran == ['add']
