"""How a job is started, walked through what a careless or hostile user,
a half-set environment or a second job gives: IPv6 hosts and TF_CONFIG
addresses TensorFlow would wait on for good, one host named twice, absurd
worker counts, rank and attempt variables set wrong, unreadable Slurm
variables, a tf.data service port in use. Each ends in exactly one
`error:` line saying what to fix, exit code 2, no traceback, and nothing
made or changed on disk (its folder's tree hash before and after). All in
this process (support/runner.call), as test_hostile_inputs.py's cases."""

import json
import socket

import pytest

from tests.e2e.test_hostile_inputs import LAUNCHER
from tests.e2e.test_hostile_inputs import NO_ALLOCATION
from tests.e2e.test_hostile_inputs import SERVICE
from tests.e2e.test_hostile_inputs import TRAINER
from tests.e2e.test_hostile_inputs import _id
from tests.e2e.test_hostile_inputs import run
from tests.e2e.test_hostile_inputs import tree_hash
from tests.support import runner


@pytest.fixture(scope='module')
def place(tmp_path_factory):
  """A folder holding a user's file, where each case's --model_dir would
  be made ({run}), and a port something else listens on ({port})."""
  root = tmp_path_factory.mktemp('hostile_launch')
  (root / 'notes.txt').write_text('mine\n')
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.bind(('', 0))
    taken.listen(1)
    yield {'root': str(root), 'run': str(root / 'run'),
           'port': taken.getsockname()[1]}


def _tf_config(*workers, index=0):
  return json.dumps({'cluster': {'worker': list(workers)},
                     'task': {'type': 'worker', 'index': index}})


MIRRORED = ['-ds', 'multi_worker_mirrored']

# (program, arguments, environment, what the error line must say); {run},
# {root} and {port} filled in from `place`, in the environment too. The
# trainer's cases run the tiny recipe into {run}.
CASES = [
    # TF_CONFIG: TensorFlow started its server at these, then waited for
    # good, deaf to SIGTERM (or failed obscurely).
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('::1:24569')},
     ["TF_CONFIG's worker 0", 'write an IPv6 address in brackets, '
      '[::1]:24569']),
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('[::1]:2410',
                                                 'fd00::9:2411')},
     ["TF_CONFIG's worker 1", '[fd00::9]:2411']),
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('192.0.2.1:2410')},
     ['worker 0 of TF_CONFIG (192.0.2.1:2410)', 'not an address of this host',
      "give this host's own name or address"]),
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('localhost:0')},
     ['a number from 1 to 65535']),
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('localhost:2410', index=3)},
     ['TF_CONFIG is not a valid cluster description']),
    (TRAINER, MIRRORED, {'TF_CONFIG': _tf_config('[::1]:{port}')},
     ['([::1]:{port})', 'port {port} is not free', 'TF_BASE_PORT']),
    # Rank and attempt variables set half or wrong.
    (TRAINER, [], {'OMPI_COMM_WORLD_RANK': 'x', 'OMPI_COMM_WORLD_SIZE': '2'},
     ["OMPI_COMM_WORLD_RANK='x' is not a whole number from 0"]),
    (TRAINER, [], {'OMPI_COMM_WORLD_RANK': 'x'}, ["OMPI_COMM_WORLD_RANK='x'"]),
    (TRAINER, [], {'OMPI_COMM_WORLD_RANK': '1'},
     ['OMPI_COMM_WORLD_RANK is set without OMPI_COMM_WORLD_SIZE']),
    (TRAINER, [], {'PMI_RANK': '5', 'PMI_SIZE': '2'},
     ['PMI_RANK=5 is not a rank of PMI_SIZE=2 workers']),
    (TRAINER, [], {'SLURM_PROCID': 'x', 'SLURM_STEP_NUM_TASKS': '2'},
     ["SLURM_PROCID='x'"]),
    (TRAINER, [], {'SLURM_RESTART_COUNT': 'x'}, ["SLURM_RESTART_COUNT='x'"]),
    (TRAINER, [], {'RESNET_KERAS_RESTARTS': '-1'},
     ["RESNET_KERAS_RESTARTS='-1'", 'the launcher sets it']),
    (TRAINER, [], {'RESNET_KERAS_RESUME_STEP': 'x'},
     ["RESNET_KERAS_RESUME_STEP='x'"]),
    # The launcher (dry runs: nothing would start either way).
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': '127.0.0.1,localhost'},
     ['MULTI_HLS_IPS names one host twice (127.0.0.1 and localhost)',
      'give each host once']),
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': f'localhost,{socket.gethostname()}'},
     ['host twice', 'give each host once']),
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': 'h1,h2,H1.'},
     ['names one host twice (h1 and H1.)']),
    (LAUNCHER, ['--dry_run', '--data_service_hosts=h2,localhost,::1'],
     NO_ALLOCATION, ['--data_service_hosts names one host twice '
                     '(localhost and ::1)']),
    (LAUNCHER, ['--dry_run', '--use_horovod', '--num_workers_per_hls=2'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': '::1,2001:db8::2'},
     ['MULTI_HLS_IPS: ::1 is an IPv6 address, which mpirun does not take',
      "give the hosts' names"]),
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': '[::1],h2'},
     ['give [::1] without brackets, ::1']),
    (LAUNCHER, ['--dry_run', '--use_horovod', '--num_workers_per_hls',
                '1000000000'], NO_ALLOCATION,
     ['--num_workers_per_hls must be in [1, 1024]', 'got 1000000000']),
    (LAUNCHER, ['--dry_run', '--use_horovod', '--num_workers_per_hls=2'],
     {'SLURM_JOB_ID': '5', 'SLURM_JOB_NODELIST': 'n1',
      'SLURM_TASKS_PER_NODE': 'abc', 'MULTI_HLS_IPS': ''},
     ["cannot read SLURM_TASKS_PER_NODE='abc'", 'such as 2(x3),1']),
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {**NO_ALLOCATION, 'MULTI_HLS_IPS': 'h1,h2',
      'DOCKER_SSHD_PORT': '-oProxyCommand=x'},
     ["DOCKER_SSHD_PORT='-oProxyCommand=x' is not a port"]),
    (LAUNCHER, ['--dry_run', '--data_service_hosts=h2'],
     {**NO_ALLOCATION, 'DOCKER_SSHD_PORT': '0'}, ["DOCKER_SSHD_PORT='0'"]),
    (LAUNCHER, ['--dry_run'], {**NO_ALLOCATION, 'OMPI_COMM_WORLD_RANK': 'x'},
     ["OMPI_COMM_WORLD_RANK='x'"]),
    (LAUNCHER, ['--dry_run'], {**NO_ALLOCATION, 'SLURM_RESTART_COUNT': 'x'},
     ["SLURM_RESTART_COUNT='x'"]),
    (LAUNCHER, ['--dry_run'], {**NO_ALLOCATION, 'PMI_SIZE': '0',
                               'PMI_RANK': '0'}, ["PMI_SIZE='0'"]),
    # The tf.data service's servers on a port in use.
    (SERVICE, ['dispatcher', '--port={port}'], {},
     ['dispatcher cannot listen on port {port}', 'give another --port']),
    (SERVICE, ['worker', '--port={port}', '--dispatcher=localhost:1'], {},
     ['worker cannot listen on port {port}']),
    (SERVICE, ['worker', '--port=5051', '--dispatcher=::1:5050'], {},
     ['--dispatcher=grpc://::1:5050', 'grpc://[::1]:5050']),
]


@pytest.mark.parametrize('program,args,env,fragments', CASES,
                         ids=[_id(c) for c in CASES])
def test_a_bad_launch_is_one_line_and_touches_nothing(
    place, program, args, env, fragments, fresh_tensorflow_state):
  before = tree_hash(place['root'])
  args = [a.format(**place) for a in args]
  env = {name: value.format(**place) if name != 'TF_CONFIG' else
         value.replace('{port}', str(place['port']))
         for name, value in env.items()}
  if program == TRAINER:
    args = runner.TINY + [f'--model_dir={place["run"]}'] + args
  result = run(program, args, env)
  assert result.returncode == 2, result.stdout + result.stderr
  runner.assert_one_line_error(result, *[f.format(**place)
                                         for f in fragments])
  assert tree_hash(place['root']) == before
