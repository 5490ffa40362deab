"""The worker contract: the variables the launcher hands a worker, and
TF_CONFIG derived from a rank, as pure functions of the environment."""

import json
import pathlib
import re
import socket

import pytest

from common import hosts as hosts_lib
from common import worker_contract as contract
from common.errors import UsageError


def test_tf_config_follows_mpirun_placement():
  config = contract.tf_config_for_rank(3, 4, ['h1', 'h2'], base_port=5000)
  assert config == {'cluster': {'worker': ['h1:5000', 'h1:5001', 'h2:5000',
                                           'h2:5001']},
                    'task': {'type': 'worker', 'index': 3}}
  local = contract.tf_config_for_rank(0, 2, [])
  assert local['cluster']['worker'] == ['localhost:2410', 'localhost:2411']
  with pytest.raises(UsageError, match='spread evenly'):
    contract.tf_config_for_rank(0, 3, ['h1', 'h2'])


@pytest.mark.parametrize('environ,expected_rank', [
    ({'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2'}, 1),
    ({'PMI_RANK': '0', 'PMI_SIZE': '2', 'TF_BASE_PORT': '3000'}, 0),
])
def test_tf_config_from_the_mpi_environment(environ, expected_rank):
  config = json.loads(contract.tf_config_from_mpi(environ))
  assert config['task']['index'] == expected_rank
  port = int(environ.get('TF_BASE_PORT', 2410))
  assert config['cluster']['worker'] == [f'localhost:{port}',
                                         f'localhost:{port + 1}']


@pytest.mark.parametrize('environ,index', [
    ({'TF_CONFIG': '{"task": {"type": "worker", "index": 2}}',
      'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '3'}, 2),
    ({'SLURM_PROCID': '1', 'SLURM_STEP_NUM_TASKS': '2'}, 1),
    ({'TF_CONFIG': '{"cluster": {}}'}, 0),
    ({}, 0),
])
def test_a_worker_knows_its_index_before_its_backend_is_built(environ, index):
  assert contract.worker_index(environ) == index


def test_no_tf_config_outside_mpi():
  assert contract.tf_config_from_mpi({'PATH': '/bin'}) is None


def test_hosts_parsing():
  assert contract.parse_hosts(None) == []
  assert contract.parse_hosts(' a, b ,') == ['a', 'b']
  with pytest.raises(UsageError, match='^MULTI_HLS_IPS lists a twice'):
    contract.parse_hosts('a,a')


def test_failure_env_per_backend():
  assert contract.failure_env(60, use_horovod=True) == {
      'HOROVOD_STALL_CHECK_TIME_SECONDS': '60',
      'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '600'}
  environ = contract.failure_env(60, use_horovod=False)
  assert contract.collective_timeout(environ) == 600.0
  assert contract.collective_timeout({}) is None
  with pytest.raises(UsageError, match='not a number of seconds'):
    contract.collective_timeout({contract.COLLECTIVE_TIMEOUT_VAR: 'soon'})


def test_this_host_names_the_address_on_the_jobs_network():
  # A UDP socket's connect only picks the route: nothing is sent.
  record = contract.this_host({'MULTI_HLS_IPS': '127.0.0.1,192.0.2.1'})
  assert record['address'] == '127.0.0.1' and record['hostname']
  assert contract.this_host({'MULTI_HLS_IPS': '::1,192.0.2.1'})[
      'address'] == '::1'
  assert contract.this_host({})['address'] == ''


@pytest.mark.parametrize('host', ['n1', 'node-7.cluster.local', 'r1_n2',
                                  '10.0.0.1', 'fe80::1', '2001:db8::2'])
def test_host_names_and_addresses_are_hosts(host):
  assert contract.parse_hosts(f'h0,{host}') == ['h0', host]


ETC_HOSTS = {'localhost': ['127.0.0.1', '::1'], 'vm': ['127.0.1.1'],
             'runsc': ['127.0.0.1'],
             'n1': ['10.0.0.1'], 'n1.cluster': ['10.0.0.1'],
             'n2': ['10.0.0.2', 'fd00::2']}


@pytest.mark.parametrize('hosts,pair', [
    (['127.0.0.1', 'localhost'], ('127.0.0.1', 'localhost')),
    (['h1', 'H1.'], ('h1', 'H1.')),
    (['::1', '0:0::1'], ('::1', '0:0::1')),
    (['::ffff:127.0.0.1', 'localhost'], ('::ffff:127.0.0.1', 'localhost')),
    (['127.1', 'ip6-localhost'], ('127.1', 'ip6-localhost')),
    (['0.0.0.0', '::1'], ('0.0.0.0', '::1')),
    (['vm', '127.0.1.1'], ('vm', '127.0.1.1')),
    (['localhost', 'Myhost'], ('localhost', 'Myhost')),  # its own name
    (['localhost', 'runsc'], ('localhost', 'runsc')),  # the hosts file
    (['n1', 'n2', 'n1.cluster'], ('n1', 'n1.cluster')),
    (['fd00::2', 'n2'], ('fd00::2', 'n2')),
    (['10.77.0.1', '10.77.0.2', 'n3', 'n4', 'fd00::3'], None),
    # Stand-ins for many hosts on one machine (tests, benchmarks).
    (['127.0.1.1', '127.0.1.2', '127.0.0.3'], None),
])
def test_two_names_of_one_host_are_found_without_asking_the_network(
    hosts, pair):
  assert hosts_lib.same_host(hosts, ETC_HOSTS, this_name='myhost') == pair


def test_a_worker_reads_the_hosts_without_its_own_names():
  # The launcher checked them as its host knows them; on another host of
  # the job, that host's own name is another host than 'localhost'.
  other = 'h2' if socket.gethostname().lower() in ('localhost',) else (
      socket.gethostname())
  assert contract.parse_hosts(f'localhost,{other}') == ['localhost', other]
  with pytest.raises(UsageError, match='names one host twice'):
    contract.check_distinct(['localhost', socket.gethostname() + '.'],
                            'MULTI_HLS_IPS')


def test_a_host_listed_twice_is_one_line():
  with pytest.raises(UsageError, match=r'^MULTI_HLS_IPS names one host '
                     r'twice \(127\.0\.0\.1 and localhost\): their servers '
                     'would listen on the same ports there; give each host '
                     'once$'):
    contract.parse_hosts('127.0.0.1,localhost')
  with pytest.raises(UsageError, match='^MULTI_HLS_IPS lists h1 twice'):
    contract.parse_hosts('h1,h2,h1')


def test_ipv6_hosts_are_bracketed_wherever_a_port_follows():
  config = contract.tf_config_for_rank(1, 4, ['fd00::1', 'h2'], 2410)
  assert config['cluster']['worker'] == ['[fd00::1]:2410', '[fd00::1]:2411',
                                         'h2:2410', 'h2:2411']
  for address, expected in (('[::1]:2410', ('::1', 2410)),
                            ('h1:80', ('h1', 80)),
                            ('10.0.0.1:65535', ('10.0.0.1', 65535))):
    assert hosts_lib.split_host_port(address, 'x') == expected
  with pytest.raises(UsageError, match='MULTI_HLS_IPS: give \\[::1\\] without '
                     'brackets, ::1'):
    contract.parse_hosts('[::1]')
  with pytest.raises(UsageError, match='link-local address with a zone'):
    contract.parse_hosts('fe80::1%eth0')


@pytest.mark.parametrize('address,fragment', [
    ('::1:24569', 'write an IPv6 address in brackets, [::1]:24569'),
    ('[::1]', 'an IPv6 address needs brackets and a port, [::1]:PORT'),
    ('h1', 'give a host and its port'),
    ('h1:0', 'a number from 1 to 65535'),
    ('h1:99999', 'a number from 1 to 65535'),
    ('h1:x', 'a number from 1 to 65535'),
    ('-oX=y:22', 'is not a host name'),
])
def test_a_tf_config_address_it_cannot_use_is_one_line(address, fragment):
  environ = {'TF_CONFIG': json.dumps({
      'cluster': {'worker': ['localhost:2410', address]},
      'task': {'type': 'worker', 'index': 0}})}
  with pytest.raises(UsageError, match=re.escape(fragment)):
    contract.tf_config_task(environ)


def test_this_tasks_address_is_read_from_tf_config():
  environ = {'TF_CONFIG': json.dumps({
      'cluster': {'worker': ['[::1]:2410', 'h2:2411']},
      'task': {'type': 'worker', 'index': 0}})}
  assert contract.tf_config_task(environ) == ('worker', 0, '::1', 2410)
  for task in ({'type': 'worker', 'index': 2}, {'type': 'worker',
                                                'index': -1},
               {'type': 'chief', 'index': 0}):
    environ = {'TF_CONFIG': json.dumps({'cluster': {'worker': ['h:1']},
                                        'task': task})}
    with pytest.raises(UsageError, match='not a valid cluster description'):
      contract.tf_config_task(environ)


@pytest.mark.parametrize('environ,fragment', [
    ({'OMPI_COMM_WORLD_RANK': 'x', 'OMPI_COMM_WORLD_SIZE': '2'},
     "OMPI_COMM_WORLD_RANK='x' is not a whole number from 0"),
    ({'OMPI_COMM_WORLD_RANK': 'x'}, "OMPI_COMM_WORLD_RANK='x'"),
    ({'OMPI_COMM_WORLD_RANK': '1'},
     'OMPI_COMM_WORLD_RANK is set without OMPI_COMM_WORLD_SIZE'),
    ({'PMI_SIZE': '2'}, 'PMI_SIZE is set without PMI_RANK'),
    ({'PMI_RANK': '2', 'PMI_SIZE': '2'}, 'PMI_RANK=2 is not a rank of '
                                         'PMI_SIZE=2 workers'),
    ({'OMPI_COMM_WORLD_RANK': '0', 'OMPI_COMM_WORLD_SIZE': '0'},
     "OMPI_COMM_WORLD_SIZE='0' is not a whole number from 1"),
    ({'SLURM_PROCID': '-1'}, "SLURM_PROCID='-1'"),
    ({'PMIX_RANK': '1.5'}, "PMIX_RANK='1.5'"),
    ({'SLURM_RESTART_COUNT': 'x'}, "SLURM_RESTART_COUNT='x'"),
    ({'RESNET_KERAS_RESTARTS': 'two'}, "RESNET_KERAS_RESTARTS='two' is not a "
                                       'whole number from 0: the launcher '
                                       'sets it'),
    ({'RESNET_KERAS_RESUME_STEP': '-4'}, "RESNET_KERAS_RESUME_STEP='-4'"),
])
def test_a_rank_or_attempt_variable_set_wrong_is_one_line_naming_it(
    environ, fragment):
  with pytest.raises(UsageError, match=re.escape(fragment)):
    contract.check_environment(environ)


def test_what_launchers_set_passes_the_check():
  for environ in ({}, {'PMIX_RANK': '3', 'SLURM_PROCID': '0'},
                  {'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2',
                   'SLURM_RESTART_COUNT': '2', 'RESNET_KERAS_RESTARTS': '1',
                   'RESNET_KERAS_RESUME_STEP': ''}):
    contract.check_environment(environ)


@pytest.mark.parametrize('host', ['-oProxyCommand=touch x', '-p1', 'a b',
                                  'h;id', '$(id)', 'h`id`', "h'", 'h\n1',
                                  'h/1', 'h:22'])
def test_anything_else_is_refused_naming_where_it_came_from(host):
  with pytest.raises(UsageError, match='^MULTI_HLS_IPS: .* is not a host '
                                       'name or an IP address'):
    contract.parse_hosts(f'h0,{host}')


@pytest.mark.parametrize('value,workers', [('abc', 1), ('0', 1), ('-5', 1),
                                           ('99999', 1), ('65535', 2)])
def test_a_base_port_out_of_range_is_refused(value, workers):
  with pytest.raises(UsageError, match=f'^TF_BASE_PORT={value}: .* give a '
                                       'port number from 1 to'):
    contract.tf_base_port({'TF_BASE_PORT': value}, workers)


def test_more_workers_per_host_than_ports_is_one_line():
  with pytest.raises(UsageError, match='^1000000000 workers per host would '
                     'each listen on a port of its own'):
    contract.tf_base_port({}, 1000000000)


def test_the_base_port_and_the_ports_above_it_fit():
  assert contract.tf_base_port({}, 8) == contract.DEFAULT_TF_BASE_PORT
  assert contract.tf_base_port({'TF_BASE_PORT': '65534'}, 2) == 65534


def test_the_attempt_variables_read_back_as_written():
  assert contract.restart_count({}) == 0
  written = contract.attempt_env(3, 12)
  assert contract.restart_count(written) == 3
  assert contract.resume_step(written) == 12
  assert contract.resume_step(contract.attempt_env(0, None)) is None
  assert contract.restart_count({contract.RESTARTS_VAR: '2'}) == 2
  assert contract.earlier_attempts({}) == 0
  # A job Slurm requeued runs its script again: those attempts count too.
  assert contract.earlier_attempts({contract.RESTARTS_VAR: '1',
                                      contract.SLURM_RESTART_COUNT_VAR: '2'}) == 3
  assert contract.resume_step({}) is None
  assert contract.resume_step({contract.RESUME_STEP_VAR: ''}) is None
  assert contract.resume_step({contract.RESUME_STEP_VAR: '0'}) == 0
  assert contract.resume_step({contract.RESUME_STEP_VAR: '12'}) == 12


def test_hosts_written_by_the_launcher_read_back_in_order():
  written = contract.hosts_env(['n2', 'n1'])
  assert contract.hosts(written) == ['n2', 'n1']
  assert contract.hosts({}) == []


def test_a_tf_config_is_derived_from_the_rank_only_where_none_is_set():
  environ = {'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2'}
  derived = contract.ensure_tf_config(environ)
  assert json.loads(derived)['task']['index'] == 1
  assert contract.tf_config(environ) == derived
  assert contract.several_workers(environ)
  user_set = {contract.TF_CONFIG_VAR: '{"task": {"index": 0}}'}
  assert contract.ensure_tf_config(user_set) is None
  assert contract.tf_config(user_set) == '{"task": {"index": 0}}'
  assert not contract.several_workers({'PMI_RANK': '0', 'PMI_SIZE': '1'})


def test_a_slurm_job_is_read_from_its_environment():
  job = {contract.SLURM_JOB_ID_VAR: '31',
         contract.SLURM_JOB_NODELIST_VAR: 'n[1-3]',
         contract.SLURM_TASKS_PER_NODE_VAR: '2(x3)'}
  assert contract.in_slurm_allocation(job)
  assert not contract.in_slurm_allocation({})
  assert contract.slurm_job_id(job) == '31'
  assert contract.slurm_job_nodes(job) == ['n1', 'n2', 'n3']
  assert contract.slurm_tasks_per_node(job) == '2(x3)'
  assert contract.slurm_tasks_per_node({}) == ''


def test_no_other_module_names_a_worker_variable():
  """The launcher writes them and the trainer reads them through this
  module: a second spelling elsewhere would drift from it."""
  repo = pathlib.Path(__file__).resolve().parents[2]
  named = re.compile(r'''(['"])(SLURM_[A-Z_]+|TF_CONFIG|RESNET_KERAS_[A-Z_]+|'''
                     r'''MULTI_HLS_IPS|TF_BASE_PORT)\1''')
  found = {str(path.relative_to(repo)):
               [name for _, name in named.findall(path.read_text())]
           for folder in ('common', 'resnet_keras')
           for path in (repo / folder).rglob('*.py')}
  assert found.pop('common/worker_contract.py')
  assert {path: names for path, names in found.items() if names} == {}
