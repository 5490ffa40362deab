"""The launch layer as a library (resnet_keras/launcher/): its options
declared once, the presets quoted by the docs, the placement each launch
gets, the commands a job builds and where its restarts resume, called in
this process without starting anything."""

import os
import re
import signal
import sys
from unittest import mock

import pytest
from absl import flags

from common import worker_contract
from resnet_keras.config import RunConfig
from resnet_keras.launcher import failures
from resnet_keras.launcher import job as job_lib
from resnet_keras.launcher import launch_config
from resnet_keras.launcher import main as launcher
from resnet_keras.launcher import preflight
from resnet_keras.launcher import presets
from resnet_keras.launcher import registry
from resnet_keras.launcher import supervisor
from resnet_keras.launcher import slurm
from resnet_keras.launcher import ssh_hosts
from resnet_keras.launcher.kubeflow import Kubeflow
from resnet_keras.launcher.launch_config import LaunchConfig
from resnet_keras.launcher.ssh_hosts import SshHosts
from resnet_keras.launcher.this_host import ThisHost
from tests.support import runner

HOSTS = '192.0.2.1,192.0.2.2,192.0.2.3'


def test_the_launchers_flags_come_from_its_declarations():
  values = flags.FlagValues()
  launch_config.define_flags(values)
  values(['prog', '--min_hosts=2', '--data_service_hosts=a,b', '-bs', '4'])
  cfg = launch_config.from_flags(values)
  assert cfg.min_hosts == 2 and cfg.data_service_hosts == ('a', 'b')
  assert launch_config.RECIPE_KEYS == ('num_workers_per_hls',
                                       'horovod_hierarchical_allreduce',
                                       'kubernetes_run')
  # Never forwarded: every launcher option, and --config/--print_config.
  assert launch_config.strip(['--min_hosts', '2', '--nodry_run',
                              '--config=x', '--print_config',
                              '--elastic_batch=scale', '-bs',
                              '4']) == ['-bs', '4']
  for workers in (0, 1025, 1000000000):
    # Not a TF_BASE_PORT 'from 1 to -999934464' for the last.
    with pytest.raises(Exception, match=re.escape(
        f'--num_workers_per_hls must be in [1, 1024] (one process per GPU '
        f'or group of cores), got {workers}')):
      LaunchConfig(num_workers_per_hls=workers).check()


def _parsed(argv):
  values = flags.FlagValues()
  launch_config.define_flags(values)
  values(argv)
  return values


def test_the_command_line_is_forwarded_as_absl_read_it(tmp_path):
  flagfile = tmp_path / 'flags.txt'
  flagfile.write_text('--max_restarts=1\n--data_dir=data\n')
  argv = ['prog', '--model_dir', '--dry_run', '--flagfile', str(flagfile),
          '-bs', '4', '--use_horovod', '--nodry_run']
  values = _parsed(argv)
  assert values.model_dir == '--dry_run' and not values.dry_run
  parsed = launch_config.as_parsed(argv, values)
  assert parsed == ['prog', '--model_dir=--dry_run', '--max_restarts=1',
                    '--data_dir=data', '-bs=4', '--use_horovod',
                    '--nodry_run']
  # The value stays the trainer's; the flagfile's launcher flag does not.
  assert launch_config.strip(parsed[1:]) == ['--model_dir=--dry_run',
                                             '--data_dir=data', '-bs=4',
                                             '--use_horovod']


def test_a_batch_script_gets_every_path_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'my.yaml').write_text('batch_size: 4\n')
  argv = ['prog', '--config=my.yaml', '-md=runs/x', '--restore_from=/r/ckpt-8',
          '--data_dir=gs://bucket/data', '-bs=4', '--dtype=fp32']
  assert slurm.absolute_paths(argv, {'pretrained_checkpoint': 'p',
                                     'batch_size': 4}) == [
      'prog', f'--config={tmp_path}/my.yaml', f'-md={tmp_path}/runs/x',
      '--restore_from=/r/ckpt-8', '--data_dir=gs://bucket/data', '-bs=4',
      '--dtype=fp32', f'--pretrained_checkpoint={tmp_path}/p']
  # A recipe's name is not a path.
  argv = ['prog', '--config=fashion_mnist_fast']
  assert slurm.absolute_paths(argv, {}) == argv


def test_the_docs_quote_the_presets_from_the_recipes():
  assert presets.preset('LARS', 1)['base_learning_rate'] == 2.5
  assert presets.preset('LARS', 16)['base_learning_rate'] == 9.5
  assert presets.preset('RMSProp', 1) == {}
  with open(os.path.join(runner.REPO_ROOT, 'docs', 'multi_host.md')) as f:
    docs = f.read()
  table = '\n'.join('  ' + line
                    for line in presets.markdown_table().splitlines())
  assert table in docs


@pytest.mark.parametrize('launch_cfg,environ,kind', [
    (LaunchConfig(), {}, ThisHost),
    (LaunchConfig(), {'MULTI_HLS_IPS': HOSTS}, SshHosts),
    (LaunchConfig(kubernetes_run=True), {'MULTI_HLS_IPS': HOSTS}, Kubeflow),
])
def test_each_launch_gets_its_placement(launch_cfg, environ, kind):
  assert type(registry.placement_for(launch_cfg, environ)) is kind


def _job(tmp_path, launch_cfg, environ=None, **trainer):
  cfg = RunConfig(**{'model_dir': str(tmp_path / 'model'), 'use_horovod': True,
                     'batch_size': 4, **trainer})
  placement = registry.placement_for(launch_cfg, environ or {})
  return job_lib.Job(placement, cfg, ['demo', '--use_horovod', '-bs', '4'],
                     {'warmup_epochs': 3}, servers=[])


def test_commands_by_placement(tmp_path):
  one = _job(tmp_path, LaunchConfig()).command()
  assert one.argv == [sys.executable, job_lib.TRAINER, '--use_horovod', '-bs',
                      '4', '--warmup_epochs=3']
  # --allow-run-as-root as root only: mpirun refuses root without it.
  for euid, as_root in ((1000, []), (0, ['--allow-run-as-root'])):
    with mock.patch.object(os, 'geteuid', return_value=euid):
      two = _job(tmp_path, LaunchConfig(num_workers_per_hls=2)).command()
    assert two.argv[:3 + len(as_root)] == ['mpirun', *as_root, '-np', '2']
  assert '--hostfile' not in two.argv
  assert two.env['HOROVOD_STALL_CHECK_TIME_SECONDS'] == '60'
  hosts = _job(tmp_path, LaunchConfig(), {'MULTI_HLS_IPS': HOSTS}).command()
  assert hosts.argv[hosts.argv.index('-np') + 1] == '3'
  assert list(hosts.files.values()) == [
      ''.join(f'{h} slots=1\n' for h in HOSTS.split(','))]
  rank = _job(tmp_path, LaunchConfig(kubernetes_run=True, num_workers_per_hls=8),
              {'MULTI_HLS_IPS': HOSTS}).command()
  assert rank.argv[1] == job_lib.TRAINER


def _write_checkpoint_state(model_dir, step):
  """The files of model_dir's latest checkpoint that say its step (in a
  run's directory: its record of what it wrote)."""
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, 'run_files.txt'), 'a') as f:
    f.write(f'"checkpoint"\n"ckpt-{step}.index"\n')
  with open(os.path.join(model_dir, 'checkpoint'), 'w') as f:
    f.write(f'model_checkpoint_path: "ckpt-{step}"\n'
            f'all_model_checkpoint_paths: "ckpt-{step}"\n')
  open(os.path.join(model_dir, f'ckpt-{step}.index'), 'w').close()


def test_a_restart_resumes_at_the_last_checkpoint_and_says_so(tmp_path,
                                                             caplog):
  job = _job(tmp_path, LaunchConfig(num_workers_per_hls=2), clean=True)
  _write_checkpoint_state(tmp_path / 'model', 8)
  first = job.first_attempt()
  assert first.resume_step is None  # --clean: the first attempt starts over.
  _write_checkpoint_state(tmp_path / 'model', 12)
  failure = failures.Failure(137, 'rank 1 was killed', retry=True)
  restart = job.replan(failure)
  assert restart.resume_step == 12 and restart.argv == first.argv
  assert 'the job restarts on the same host(s): resuming at step 12' in \
      caplog.text
  job.files.remove()


class _Lossy(SshHosts):
  """ssh hosts of which the last fails its check from the second on."""
  checks = 0

  def check(self, hosts, want, ports):
    _Lossy.checks += 1
    ready = hosts[:-1] if _Lossy.checks > 1 else hosts
    return preflight.Report([f'host {h}: down' for h in hosts
                             if h not in ready], 1, tuple(ready))


def test_an_elastic_restart_shrinks_on_the_hosts_that_pass(tmp_path, caplog,
                                                          monkeypatch):
  monkeypatch.setattr(registry, 'PLACEMENTS', tuple(
      _Lossy if kind is SshHosts else kind for kind in registry.PLACEMENTS))
  monkeypatch.setattr(_Lossy, 'checks', 0)
  job = _job(tmp_path, LaunchConfig(min_hosts=2), {'MULTI_HLS_IPS': HOSTS})
  assert type(job.placement) is _Lossy and job.is_elastic
  job.first_attempt()
  _write_checkpoint_state(tmp_path / 'model', 4)
  attempt = job.replan(failures.Failure(1, 'lost', retry=True))
  assert attempt.hosts == ('192.0.2.1', '192.0.2.2')
  assert attempt.resume_step == 4
  assert attempt.env['MULTI_HLS_IPS'] == '192.0.2.1,192.0.2.2'
  # The command line's batch flag gives way to the split on two hosts.
  assert attempt.argv[-5:] == [job_lib.TRAINER, '--use_horovod',
                               '--batch_size=6', '--num_accumulation_steps=2',
                               '--warmup_epochs=3']
  assert 'the job shrinks from 3 to 2 host(s)' in caplog.text
  assert 'resuming at step 4' in caplog.text
  job.files.remove()


class _Returning(SshHosts):
  """ssh hosts whose answers the test sets: those in `down` fail."""
  down = set()
  asked = []

  def check(self, hosts, want, ports, timeout=preflight.SSH_TIMEOUT):
    _Returning.asked.append((tuple(hosts), timeout))
    return preflight.Report(
        [f'host {h}: down' for h in hosts if h in _Returning.down], 1,
        tuple(h for h in hosts if h not in _Returning.down))


def test_a_dropped_host_that_answers_again_may_rejoin_and_one_that_flaps_waits(
    tmp_path, monkeypatch):
  monkeypatch.setattr(registry, 'PLACEMENTS', tuple(
      _Returning if kind is SshHosts else kind
      for kind in registry.PLACEMENTS))
  third = HOSTS.split(',')[2]
  monkeypatch.setattr(_Returning, 'down', {third})
  monkeypatch.setattr(_Returning, 'asked', [])
  job = _job(tmp_path, LaunchConfig(min_hosts=2), {'MULTI_HLS_IPS': HOSTS})
  assert job.grows_back
  assert job.first_attempt().hosts == tuple(HOSTS.split(',')[:2])
  # Only the dropped host is asked, quickly (the job's end waits for it).
  assert job.returning_hosts() is None
  assert _Returning.asked[-1] == ((third,), preflight.QUICK_TIMEOUT)
  _Returning.down.clear()
  assert job.returning_hosts() == f'elastic: host(s) {third} answer again'
  assert job.replan(None).hosts == tuple(HOSTS.split(','))
  asked = len(_Returning.asked)
  assert job.returning_hosts() is None and len(_Returning.asked) == asked
  # Dropped a second time: it answers, but waits out its cool-down unasked.
  _Returning.down.add(third)
  job.replan(failures.Failure(1, 'lost', retry=True))
  _Returning.down.clear()
  asked = len(_Returning.asked)
  assert job.returning_hosts() is None and len(_Returning.asked) == asked
  job.files.remove()
  no_cap = _job(tmp_path, LaunchConfig(min_hosts=2,
                                       max_membership_changes_per_hour=0),
                {'MULTI_HLS_IPS': HOSTS})
  assert not no_cap.grows_back


def test_ssh_is_as_mpirun_runs_it():
  argv, port = ssh_hosts.ssh({'DOCKER_SSHD_PORT': '4022'})
  assert port == '4022' and argv[:3] == ['ssh', '-p', '4022']


ALLOCATION = {'SLURM_JOB_ID': '42', 'SLURM_JOB_NODELIST': 'n[1-3]',
              'MULTI_HLS_IPS': '192.0.2.9'}


def test_inside_an_allocation_workers_start_with_srun(tmp_path, caplog):
  cfg = RunConfig(model_dir=str(tmp_path), use_horovod=True, batch_size=4)
  placement = slurm.Slurm(LaunchConfig(num_workers_per_hls=2),
                          {**ALLOCATION, 'SLURM_TASKS_PER_NODE': '1(x3)'},
                          [], use_horovod=True,
                          addresses=['10.0.0.1', '10.0.0.2', '10.0.0.3'])
  assert ('--num_workers_per_hls=2: 2 worker(s) on each node, where the '
          'allocation has 1(x3) task(s) per node') in caplog.text
  assert placement.headline() == 'slurm job 42: 3 nodes x 2 workers'
  job = job_lib.Job(placement, cfg, ['demo', '--use_horovod'], {}, [])
  plan = job.command()
  # Slurm's compressed node list, as srun reads it.
  assert plan.argv[:7] == ['srun', '--nodes=3', '--nodelist=n[1-3]',
                           '--ntasks-per-node=2', '--ntasks=6',
                           '--kill-on-bad-exit=1',
                           '--job-name=resnet_keras_train']
  assert '--mpi=pmix' in plan.argv
  # A restart's step is not held by the earlier one's CPUs (a lost node's).
  assert slurm.STEP_OVERLAP in plan.argv
  assert plan.argv[plan.argv.index(job_lib.TRAINER) + 1:] == ['--use_horovod']
  # The tasks' TF_CONFIG (multi_worker_mirrored) name the nodes' addresses,
  # not MULTI_HLS_IPS.
  assert plan.env['MULTI_HLS_IPS'] == '10.0.0.1,10.0.0.2,10.0.0.3'
  assert placement.parses_output(plan)  # srun names a lost node.


@pytest.mark.parametrize('refused', [None, 'Requested operation is '
                                     'presently disabled for job 42'])
def test_the_warning_requeues_the_job_in_one_line(monkeypatch, caplog,
                                                  refused):
  asked = []
  monkeypatch.setattr(slurm, 'requeue',
                      lambda job_id: asked.append(job_id) or refused)
  placement = slurm.Slurm(LaunchConfig(), ALLOCATION, [], use_horovod=False,
                          addresses=['a1', 'a2', 'a3'])
  handler = signal.getsignal(signal.SIGTERM)
  try:
    assert placement.stopped_at_warning(12) == 138
    # Slurm ends the batch script of a job it requeues with SIGTERM.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGTERM, handler)
  assert asked == ['42']
  line, = [r.getMessage() for r in caplog.records]
  assert line.startswith('slurm job 42 signalled (SIGUSR1): the workers saved '
                         'at step 12 and stopped; ')
  assert line.endswith('resubmit the batch script to resume there' if refused
                       else 'it resumes there when Slurm starts it again')


def test_a_restart_runs_on_the_nodes_the_job_still_holds(monkeypatch):
  monkeypatch.setattr(slurm, 'job_nodes', lambda job_id: ['n1', 'n3'])
  placement = slurm.Slurm(LaunchConfig(), ALLOCATION, [], use_horovod=False,
                          addresses=['a1', 'a2', 'a3'])
  report = placement.check(placement.hosts, None, {})
  assert report.ready == ('n1', 'n3')
  assert report.problems == ['node n2: no longer in slurm job 42 (Slurm took '
                             'it out: it failed)']
  plan = placement.command(['train'], report.ready, {}, 1)
  assert '--nodelist=n[1,3]' in plan.argv and '--ntasks=2' in plan.argv
  assert plan.env['MULTI_HLS_IPS'] == 'a1,a3'


def test_the_launcher_option_picks_slurm_or_refuses_outside_it():
  auto = registry.placement_for(LaunchConfig(), {**ALLOCATION})
  assert type(auto) is slurm.Slurm and auto.hosts == ('n1', 'n2', 'n3')
  assert type(registry.placement_for(LaunchConfig(launcher='ssh'),
                                     ALLOCATION)) is SshHosts
  with pytest.raises(Exception, match='runs inside a Slurm allocation'):
    registry.placement_for(LaunchConfig(launcher='slurm'), {})


def test_the_batch_script_runs_the_launch_again_inside_the_allocation():
  argv = ['demo_resnet_keras.py', '--dry_run', '--launcher', 'slurm',
          '--slurm_nodes=3', '-ds', 'multi_worker_mirrored',
          '--num_workers_per_hls=2', '-md', '/shared/my runs']
  script = slurm.batch_script(argv, LaunchConfig(num_workers_per_hls=2), 3,
                              4, '/usr/bin/python3', '/opt/resnet keras')
  assert script == """\
#!/bin/bash
#SBATCH --job-name=resnet_keras
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
# This host's physical cores per worker: set it to the compute nodes'.
#SBATCH --cpus-per-task=4
#SBATCH --signal=USR1@120
#SBATCH --requeue
# A requeued job appends to its output instead of truncating it.
#SBATCH --open-mode=append
#SBATCH --output=resnet_keras-%j.out
cd '/opt/resnet keras'
exec /usr/bin/python3 demo_resnet_keras.py -ds multi_worker_mirrored \
--num_workers_per_hls=2 -md '/shared/my runs' --launcher=slurm
"""


@pytest.mark.parametrize('launch_cfg,environ,error', [
    (LaunchConfig(slurm_nodes=2, launcher='slurm'), {},
     '--slurm_nodes=2 sets the nodes of the batch script that --dry_run '
     '--launcher=slurm prints: add both'),
    (LaunchConfig(slurm_nodes=2, dry_run=True), {},
     '--slurm_nodes=2 sets the nodes'),
    (LaunchConfig(slurm_nodes=2, dry_run=True, launcher='slurm'), ALLOCATION,
     '--slurm_nodes=2: inside a Slurm allocation (SLURM_JOB_ID=42) the nodes '
     'are the allocation\'s'),
])
def test_slurm_nodes_only_where_a_batch_script_is_printed(launch_cfg, environ,
                                                          error):
  with pytest.raises(Exception, match=re.escape(error)):
    slurm.prints_batch_script(launch_cfg, environ)


def test_which_launches_print_a_batch_script():
  script = LaunchConfig(dry_run=True, launcher='slurm', slurm_nodes=2)
  assert slurm.prints_batch_script(script, {})
  assert not slurm.prints_batch_script(LaunchConfig(dry_run=True), {})
  assert not slurm.prints_batch_script(
      LaunchConfig(dry_run=True, launcher='slurm'), ALLOCATION)
  assert not slurm.prints_batch_script(LaunchConfig(launcher='slurm'), {})


def test_a_requeued_job_resumes_whatever_its_script_says(tmp_path, caplog):
  """Slurm runs a requeued job's batch script again, --clean and all:
  the launcher resumes at the last checkpoint (and the trainer keeps
  model_dir: worker_contract.earlier_attempts)."""
  job = _job(tmp_path, LaunchConfig(),
             {'SLURM_RESTART_COUNT': '1'}, clean=True)
  _write_checkpoint_state(tmp_path / 'model', 8)
  job.first_attempt()
  assert 'requeued 1 time(s) by the scheduler: resuming at step 8' in \
      caplog.text


@pytest.mark.parametrize('module', [launcher, supervisor, failures])
def test_the_launch_and_its_supervision_name_no_scheduler(module):
  """A scheduler is its placement's module alone (slurm.py): main.py and
  the supervisor go through the Placement's hooks."""
  with open(module.__file__) as f:
    assert not re.search(r'slurm|srun|sbatch|scontrol', f.read(), re.I)
