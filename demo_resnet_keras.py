"""Launches resnet_ctl_imagenet_main.py: optimizer presets, then 1..N workers.

  python demo_resnet_keras.py -dt bf16 -dlit bf16 -bs 256 -te 90 -ebe 90
  python demo_resnet_keras.py --optimizer LARS -dt bf16
  python demo_resnet_keras.py --use_horovod --num_workers_per_hls 8 \\
      --optimizer LARS -dt bf16 -bs 256 -te 40 -ebe 40
  python demo_resnet_keras.py -ds multi_worker_mirrored \\
      --num_workers_per_hls 2 -bs 512
  MULTI_HLS_IPS=10.0.0.1,10.0.0.2 python demo_resnet_keras.py --use_horovod \\
      --num_workers_per_hls 8 --optimizer LARS
  python demo_resnet_keras.py ... --data_service_hosts h2,h3  # remote input
  python demo_resnet_keras.py ... --dry_run   # print the command, run nothing

Every flag of resnet_ctl_imagenet_main.py is accepted and forwarded as typed.
--config NAME (resnet_keras/configs/NAME.yaml) fills in a recipe's values,
launcher settings included; then --optimizer LARS / SGD fill in their preset
hyperparameters (RMSProp has none); neither replaces a value given on the
command line (in any spelling), and a preset never replaces a recipe's
value. The trainer gets every filled-in value as a flag, so --dry_run shows
them all. With more than one worker in total (--num_workers_per_hls > 1 or
several MULTI_HLS_IPS hosts) the workers are started with mpirun;
they train with Horovod (--use_horovod; -bs per worker) or tf.distribute
(--distribution_strategy=multi_worker_mirrored; -bs global, each rank's
TF_CONFIG derived from its MPI rank). Environment: MULTI_HLS_IPS (the
hosts, comma-separated: the reference's name, kept for its command lines),
MPI_TCP_INCLUDE, DOCKER_SSHD_PORT (3022), MPI_ROOT, TF_BASE_PORT (2410).
Several hosts are checked (ssh, Python, TensorFlow, Horovod, the project,
ports) before anything starts. A failed job ends with one line naming the
lost rank or host; --max_restarts starts it again from the last checkpoint.
--min_hosts N makes the job elastic: hosts that fail the check (at the start
or at a restart) are left out while N remain, the global batch is re-split
over the workers left (--elastic_batch), and a host that passes again
rejoins at the next restart (common/elastic.py).
--data_service_hosts starts a tf.data service (a dispatcher on the first
host, a data worker on each) over the same ssh before the job, points the
trainer at it and stops it when the job ends (common/data_servers.py).
The exit code is the training job's (its last attempt's).
"""

import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time

from common import env

env.prepare_tensorflow_environment()

from absl import flags  # pylint: disable=g-import-not-at-top
from absl import logging  # pylint: disable=g-import-not-at-top

from common import cli  # pylint: disable=g-import-not-at-top
from common import data_servers  # pylint: disable=g-import-not-at-top
from common import elastic  # pylint: disable=g-import-not-at-top
from common import launch  # pylint: disable=g-import-not-at-top
from common import preflight  # pylint: disable=g-import-not-at-top
from common import supervisor  # pylint: disable=g-import-not-at-top
from resnet_keras import flags as flags_lib  # pylint: disable=g-import-not-at-top
from resnet_keras import recipes  # pylint: disable=g-import-not-at-top
from resnet_keras import run_directory  # pylint: disable=g-import-not-at-top
from common.errors import UsageError  # pylint: disable=g-import-not-at-top

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'resnet_ctl_imagenet_main.py')

FLAGS = flags.FLAGS


def define_flags(values: flags.FlagValues) -> None:
  """The trainer's flags (forwarded to it) and the launcher's own."""
  flags_lib.define_flags(values)
  flags.DEFINE_integer('num_workers_per_hls', 1,
                       'Workers (processes) per host (the reference\'s name: '
                       'an HLS is a Habana host; its hosts list is '
                       'MULTI_HLS_IPS). More than one worker in total runs '
                       'them with mpirun; needs --use_horovod or '
                       '--distribution_strategy=multi_worker_mirrored.',
                       flag_values=values)
  flags.DEFINE_boolean('kubernetes_run', False,
                       'Each rank is already started by an external launcher '
                       '(e.g. a Kubeflow MPIJob): run this rank in-process, '
                       'without mpirun.',
                       flag_values=values)
  flags.DEFINE_boolean('horovod_hierarchical_allreduce', False,
                       'Set HOROVOD_HIERARCHICAL_ALLREDUCE=1 (allreduce '
                       'within each host first; for multi-host Horovod).',
                       flag_values=values)
  flags.DEFINE_boolean('dry_run', False,
                       'Print the command(s), environment, per-worker '
                       'TF_CONFIG and pre-flight checks, then exit without '
                       'running anything.',
                       flag_values=values)
  flags.DEFINE_integer('max_restarts', 0,
                       'Start the whole job again, up to this many times, '
                       'when it fails for a reason a rerun can fix (a lost '
                       'worker or host, a network failure, a signal to one '
                       'rank); the workers resume from the last checkpoint '
                       '(--checkpoint_interval_steps bounds what is lost). '
                       'Usage errors, a non-finite loss and a signal to the '
                       'launcher are never retried.',
                       flag_values=values)
  flags.DEFINE_integer('min_hosts', 0,
                       'Elastic job: the fewest MULTI_HLS_IPS hosts it may '
                       'go on with (0: all of them, fail-stop). At start a '
                       'host that fails the pre-flight check is left out, '
                       'named; after a failure a rerun can fix (up to '
                       '--max_restarts times) every host is checked again '
                       'and the job restarts from the last checkpoint on '
                       'those that pass, so a lost host is dropped and one '
                       'that answers again rejoins. The global batch is '
                       'kept (see --elastic_batch). The chief is the first '
                       'host left: --model_dir must be on storage every '
                       'host shares.',
                       flag_values=values, lower_bound=0)
  flags.DEFINE_enum('elastic_batch', elastic.KEEP, elastic.MODES,
                    'How an elastic job on fewer hosts splits its batch: '
                    'keep: the planned global batch, each worker taking a '
                    'larger share (in micro-batches no larger than planned), '
                    'so the schedule and result are the planned run\'s '
                    '(the worker count must divide it; checked at start); '
                    'scale: each worker keeps its batch, the global batch '
                    'shrinks with the workers and the learning rate with it '
                    '(linear scaling; the trainer gets --planned_global_batch).',
                    flag_values=values)
  flags.DEFINE_list('data_service_hosts', [],
                    'Run the training input pipeline on these hosts '
                    '(comma-separated): a tf.data service dispatcher on the '
                    'first, a data worker on each, started over ssh '
                    '(DOCKER_SSHD_PORT) before training and stopped after; '
                    'the trainer gets --tf_data_service.',
                    flag_values=values)
  flags.DEFINE_integer('data_service_port', launch.DEFAULT_DATA_SERVICE_PORT,
                       'The dispatcher\'s port; data workers listen on the '
                       'next one.',
                       flag_values=values, lower_bound=1, upper_bound=65534)
  flags.DEFINE_string('data_service_work_dir', '/tmp/resnet_keras_data_service',
                      'The dispatcher\'s journal on its host: a dispatcher '
                      'restarted with it resumes its jobs.',
                      flag_values=values)
  flags.DEFINE_integer('failure_timeout', launch.DEFAULT_FAILURE_TIMEOUT,
                       'Seconds within which a lost host or rank ends a '
                       'multi-worker job (mpirun\'s keepalive probes; '
                       'Horovod\'s stall check and multi_worker_mirrored\'s '
                       'collective timeout get 10x this, for a rank alive '
                       'but stuck).',
                       flag_values=values)


def preset(optimizer: str, total_workers: int) -> dict:
  """The recipe's hyperparameters for `--optimizer` (reference README).

  LARS's base learning rate was tuned for one worker (2.5) and for the
  8-worker global batch (9.5).
  """
  if optimizer == 'LARS':
    return {'base_learning_rate': 2.5 if total_workers == 1 else 9.5,
            'warmup_epochs': 3, 'lr_schedule': 'polynomial',
            'label_smoothing': 0.1, 'weight_decay': 0.0001,
            'single_l2_loss_op': True}
  if optimizer == 'SGD':  # The Model Garden's 90-epoch recipe.
    return {'base_learning_rate': 0.1, 'warmup_epochs': 5,
            'lr_schedule': 'piecewise', 'weight_decay': 0.0001}
  return {}  # RMSProp has no reference recipe: the trainer's flags as given.


def fill_in_settings(hosts) -> dict:
  """Applies --config's recipe, then the optimizer preset, to FLAGS; returns
  the trainer settings they filled in (the command line gave the rest)."""
  recipe = flags_lib.apply_config(
      FLAGS,
      allowed=flags_lib.RUN_CONFIG_KEYS | set(launch.LAUNCHER_RECIPE_KEYS))
  presets = recipes.apply(
      FLAGS, preset(FLAGS.optimizer, _total_workers(hosts)),
      f'--optimizer={FLAGS.optimizer} preset', flags_lib.RUN_CONFIG_KEYS,
      skip=recipe)
  return {name: value for name, value in {**recipe, **presets}.items()
          if name not in launch.LAUNCHER_RECIPE_KEYS}


def _total_workers(hosts) -> int:
  if FLAGS.num_workers_per_hls < 1:
    raise UsageError('--num_workers_per_hls must be >= 1, got '
                     f'{FLAGS.num_workers_per_hls}')
  return FLAGS.num_workers_per_hls * max(1, len(hosts))


def build_launch(argv, environ, hosts, total_workers: int, filled: dict,
                 hosts_per_machine: int = 1,
                 layout: elastic.Layout = None) -> launch.Launch:
  """The command this invocation runs, from parsed FLAGS, the settings
  filled in from a recipe or preset, `environ`, and how many of the hosts
  the pre-flight check found on one machine. `layout`: an elastic job's
  hosts and batch split, when they are not the command line's."""
  multi_worker = (FLAGS.use_horovod or
                  FLAGS.distribution_strategy == 'multi_worker_mirrored')
  if total_workers > 1 and not multi_worker:
    raise UsageError(
        f'{total_workers} workers need a multi-worker backend: add '
        '--use_horovod or --distribution_strategy=multi_worker_mirrored')
  if not FLAGS.use_horovod and FLAGS.batch_size % total_workers:
    raise UsageError(
        f'--batch_size={FLAGS.batch_size} is the global batch under '
        f'tf.distribute and must be a multiple of the {total_workers} '
        f'workers; use e.g. --batch_size={total_workers * max(1, FLAGS.batch_size // total_workers)}')
  valued = launch.LAUNCHER_VALUED + (elastic.BATCH_FLAGS if layout else ())
  forwarded = launch.strip_flags(argv[1:], launch.LAUNCHER_BOOLEANS, valued)
  if layout:
    filled = {k: v for k, v in filled.items() if k not in elastic.BATCH_FLAGS}
    forwarded += layout.trainer_flags(FLAGS.use_horovod)
    hosts = list(layout.hosts)
    environ = {**environ, 'MULTI_HLS_IPS': ','.join(hosts)}
    total_workers = layout.workers
  forwarded += recipes.as_args(filled)
  program = [sys.executable, TRAINER] + forwarded
  extra_env = {'MULTI_HLS_IPS': environ['MULTI_HLS_IPS']} if layout else {}
  if total_workers > 1:
    extra_env.update(launch.failure_env(FLAGS.failure_timeout,
                                        FLAGS.use_horovod))
  if FLAGS.horovod_hierarchical_allreduce:
    extra_env['HOROVOD_HIERARCHICAL_ALLREDUCE'] = '1'
  if FLAGS.kubernetes_run or total_workers == 1:
    return launch.Launch(argv=program, env=extra_env, files={}, notes=[])
  hostfile = os.path.join(tempfile.gettempdir(),
                          f'resnet_keras_hostfile_{os.getpid()}')
  return launch.mpirun_command(
      program, workers_per_host=FLAGS.num_workers_per_hls, hosts=hosts,
      physical_cores=launch.physical_core_count(), environ=environ,
      hostfile_path=hostfile, extra_env=extra_env,
      failure_timeout=FLAGS.failure_timeout,
      hosts_per_machine=hosts_per_machine)


def _check_tools(plan: launch.Launch) -> None:
  if plan.argv[0] == 'mpirun' and not shutil.which('mpirun'):
    cli.fail('mpirun not found; install OpenMPI (apt-get install openmpi-bin '
             'libopenmpi-dev, or run scripts/install_horovod.sh)')
  if FLAGS.use_horovod:
    import importlib.util  # pylint: disable=g-import-not-at-top
    if importlib.util.find_spec('horovod') is None:
      cli.fail('--use_horovod needs Horovod; install it with '
               'scripts/install_horovod.sh')


def _print_tf_configs(environ, total_workers: int) -> None:
  """multi_worker_mirrored: the TF_CONFIG each rank will derive."""
  if (FLAGS.distribution_strategy != 'multi_worker_mirrored' or
      total_workers == 1):
    return
  for rank in range(total_workers):
    config = launch.tf_config_from_env(rank, total_workers, environ)
    print(f'TF_CONFIG rank {rank}: {json.dumps(config)}')


def _ssh(environ):
  """(ssh argv, its port) as mpirun and the data service hosts use it."""
  port = environ.get('DOCKER_SSHD_PORT', str(launch.DEFAULT_SSH_PORT))
  return preflight.ssh_command(environ, port), port


def _data_servers(environ):
  """The tf.data service servers --data_service_hosts asks for."""
  if not FLAGS.data_service_hosts:
    return []
  return launch.data_service_servers(
      FLAGS.data_service_hosts, _ssh(environ)[0], sys.executable,
      os.path.dirname(TRAINER), FLAGS.data_service_port,
      FLAGS.data_service_work_dir)


def _checks(environ, hosts, servers):
  """(training's check, the data service's check), each (hosts, what they
  must have, ports that must be free), or None where nothing is checked."""
  training = service = None
  if hosts and not FLAGS.kubernetes_run:
    ports = {}
    if FLAGS.distribution_strategy == 'multi_worker_mirrored':
      tf_config = launch.tf_config_from_env(0, _total_workers(hosts), environ)
      ports = preflight.ports_by_host(tf_config['cluster']['worker'])
    training = (hosts, preflight.expected(TRAINER, FLAGS.use_horovod), ports)
  if servers:
    ports = {}
    for server in servers:
      ports.setdefault(server.host, []).append(server.port)
    service = (list(ports), preflight.expected(TRAINER, False), ports)
  return training, service


def _preflight(environ, hosts, servers, min_hosts: int,
               restart: bool = False):
  """Several hosts (training's and the data service's) are checked before
  anything starts on them. Fail-stop (min_hosts = all hosts): every
  training host must be ready. Elastic: training hosts that fail are left
  out, each named in one line, as long as `min_hosts` remain. Data service
  hosts must all be ready at the start; at a `restart` those that fail are
  named and DataServers.renew leaves them out. Returns the reports of the
  training hosts and of the data service's (None without one)."""
  training_check, service_check = checks = _checks(environ, hosts, servers)
  ssh, port = _ssh(environ)

  def checked(check):
    check_hosts, want, ports = check
    return preflight.check(check_hosts, ssh, want, ports, port)

  # Unchecked training hosts (one host, or --kubernetes_run) are all ready.
  training = (checked(training_check) if training_check else
              preflight.Report([], 1, tuple(hosts)))
  service = checked(service_check) if service_check else None
  fatal = []
  if service and restart:
    for line in service.problems:
      logging.error('%s', line)
  elif service:
    fatal += service.problems
  if min_hosts < len(hosts):
    for line in training.problems:
      logging.error('%s: left out of the job', line)
    if len(training.ready) < min_hosts:
      raise UsageError(
          f'only {len(training.ready)} of {len(hosts)} hosts pass the '
          f'pre-flight check ({", ".join(training.ready) or "none"}), fewer '
          f'than --min_hosts={min_hosts}')
  else:
    fatal = training.problems + fatal
  if fatal:
    for problem in fatal:
      print(f'error: {problem}', file=sys.stderr)
    every = sorted({h for check in checks if check for h in check[0]})
    raise UsageError(f'pre-flight check failed on {len(every)} host(s) '
                     f'({", ".join(every)})' +
                     ('' if restart else ': nothing was started'))
  return training, service


class _Job:
  """What each attempt of the job runs: the hosts that pass the check
  (all of them, or with --min_hosts at least that many), the batch split
  on them (common/elastic.py), the command. `replan` is the supervisor's
  between attempts; it also restarts the lost tf.data service servers of
  `data_servers`."""

  def __init__(self, environ, hosts, filled: dict, servers):
    self._environ, self._hosts = environ, hosts
    self.min_hosts = FLAGS.min_hosts or len(hosts)
    if FLAGS.min_hosts and not hosts:
      raise UsageError('--min_hosts needs several hosts in MULTI_HLS_IPS')
    if self.min_hosts > len(hosts):
      raise UsageError(f'--min_hosts={self.min_hosts} is more than the '
                       f'{len(hosts)} hosts of MULTI_HLS_IPS')
    self.planned = elastic.planned_layout(
        hosts, FLAGS.num_workers_per_hls, FLAGS.batch_size,
        FLAGS.num_accumulation_steps, FLAGS.use_horovod)
    if self.is_elastic:
      elastic.check_host_counts(self.planned, self.min_hosts,
                                FLAGS.num_workers_per_hls, FLAGS.elastic_batch)
    self.layout = self.planned
    self._filled, self._servers = filled, servers
    self._started = time.time()
    self.data_servers = None  # DataServers, once started.
    self._written = set()  # Files of the attempts (the hostfile).
    self._report = None  # The last pre-flight check's preflight.Report.

  @property
  def is_elastic(self) -> bool:
    return self.min_hosts < len(self._hosts)

  def describe(self):
    """--dry_run's lines: the layout on each host count it may run on."""
    for count in range(len(self._hosts) - 1, self.min_hosts - 1, -1):
      layout = elastic.relayout(self.planned, self._hosts[:count],
                                FLAGS.num_workers_per_hls, FLAGS.elastic_batch)
      yield (f'elastic: on {layout.describe()}'
             f'{f", learning rate x{layout.lr_scale:.4g}" if layout.lr_scale != 1 else ""}: '
             f'{" ".join(layout.trainer_flags(FLAGS.use_horovod))}')

  def first_attempt(self) -> supervisor.Attempt:
    self._report, _ = _preflight(self._environ, self._hosts, self._servers,
                                 self.min_hosts)
    # --clean applies to the first attempt only: it starts from step 0.
    latest = run_directory.latest_checkpoint(FLAGS.model_dir or '')
    step = None if FLAGS.clean or not latest else latest.step
    return self._attempt(step, lost=0.0)

  def replan(self, failure: supervisor.Failure) -> supervisor.Attempt:
    """The next attempt: on the hosts that pass a new check (an elastic job,
    or one with a tf.data service; the same hosts otherwise), resuming at
    model_dir's last checkpoint, which the trainer is told to expect."""
    del failure  # Every host is checked again, whatever failed.
    if self.is_elastic or self._servers:
      self._check_again()
    latest = run_directory.latest_checkpoint(FLAGS.model_dir or '')
    step, written = (latest.step, latest.written) if latest else (None, None)
    return self._attempt(step, time.time() - (written or self._started),
                         restart=True)

  def _check_again(self) -> None:
    try:
      self._report, service = _preflight(
          self._environ, self._hosts, self._servers, self.min_hosts,
          restart=True)
      if self.data_servers:
        for line in self.data_servers.renew(service.ready):
          logging.error(line)
        self._filled['tf_data_service_workers'] = (
            self.data_servers.num_workers)
    except UsageError as e:
      raise UsageError(f'{e}; the job ends (resume it with the same command '
                       'once enough hosts are back)') from None

  def _attempt(self, step, lost: float, restart: bool = False
               ) -> supervisor.Attempt:
    before = self.layout
    report = self._report
    layout = (elastic.relayout(self.planned, report.ready,
                               FLAGS.num_workers_per_hls, FLAGS.elastic_batch)
              if self.is_elastic else self.planned)
    if layout.hosts != before.hosts:
      logging.error(elastic.describe_change(before, layout, step, lost))
    elif restart:
      logging.error('the job restarts on the same host(s): %s; %.0f s lost',
                    elastic.resuming(step), lost)
    self.layout = layout
    self._started = time.time()
    plan = build_launch(sys.argv, self._environ, self._hosts,
                        _total_workers(self._hosts), self._filled,
                        report.hosts_per_machine,
                        layout if layout != self.planned else None)
    for note in plan.notes:
      print(f'note: {note}')
    for path, content in plan.files.items():
      with open(path, 'w') as f:
        f.write(content)
      self._written.add(path)
    sys.stdout.flush()
    return supervisor.Attempt(plan.argv, {**self._environ, **plan.env},
                              layout.hosts,
                              resume_step=(step or 0) if restart else None)

  def remove_files(self) -> None:
    """Removes the files the attempts wrote, once the job has ended."""
    for path in self._written:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def main(argv):
  cli.configure_logging()
  environ = dict(os.environ)
  hosts = launch.parse_hosts(environ.get('MULTI_HLS_IPS'))
  filled = fill_in_settings(hosts)
  total_workers = _total_workers(hosts)
  servers = _data_servers(environ)
  if servers:
    if FLAGS.tf_data_service:
      raise UsageError('--data_service_hosts starts a tf.data service and '
                       'points the trainer at it; --tf_data_service names '
                       'one started elsewhere: give one of them')
    filled['tf_data_service'] = FLAGS.tf_data_service = (
        launch.data_service_address(FLAGS.data_service_hosts,
                                    FLAGS.data_service_port))
    filled['tf_data_service_workers'] = FLAGS.tf_data_service_workers = (
        len(FLAGS.data_service_hosts))
  cfg = flags_lib.config_from_flags(FLAGS)  # Bad trainer flags fail before launch.
  if FLAGS.print_config:
    print(recipes.dump(cfg, {name: FLAGS[name].value
                             for name in launch.LAUNCHER_RECIPE_KEYS}), end='')
    return 0
  plan = build_launch(sys.argv, environ, hosts, total_workers, filled)
  job = _Job(environ, hosts, filled, servers)
  if FLAGS.dry_run:
    for note in plan.notes:
      print(f'note: {note}')
    print(plan.describe())
    _print_tf_configs(environ, total_workers)
    for server in servers:
      print(f'data service {server.role} on {server.host}: '
            f'{shlex.join(server.argv)}')
      print(f'  stopped at the end with: {shlex.join(server.stop_argv)}')
    for check in _checks(environ, hosts, servers):
      if check:
        check_hosts, want, ports = check
        print('\n'.join(preflight.describe(check_hosts, _ssh(environ)[0],
                                           want, ports)))
    if job.is_elastic:
      print('\n'.join(job.describe()))
    return 0
  _check_tools(plan)
  attempt = job.first_attempt()
  running = data_servers.DataServers(servers, logging.error)
  try:
    running.start()
    job.data_servers = running if servers else None
    exit_code = supervisor.Supervisor(
        attempt, max_restarts=FLAGS.max_restarts,
        workers_per_host=FLAGS.num_workers_per_hls,
        parse_output=plan.argv[0] == 'mpirun', log=logging.error,
        replan=job.replan,
        abort_grace=FLAGS.failure_timeout).run()
  finally:
    running.stop()
    job.remove_files()
  if exit_code and running.lost_hosts():
    logging.error('the tf.data service lost its servers on %s during the '
                  'job: restart them there (or drop them from '
                  '--data_service_hosts) and rerun to resume',
                  ', '.join(running.lost_hosts()))
  return exit_code


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
