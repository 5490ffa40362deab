"""The launcher's own options, declared once (as the trainer's are in
config.py): each LaunchConfig field's flag, its check, whether a recipe may
hold it, and that it is never forwarded to the trainer all follow from it.

The launcher accepts every trainer flag as well (flags.define_flags) and
forwards those as typed; `--config` and `--print_config` are the trainer's
flags that the launcher consumes itself.
"""

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from absl import flags

from common import hosts as hosts_lib
from common import worker_contract
from resnet_keras.config import flags as flags_lib
from resnet_keras.config import options
from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import elastic
from resnet_keras.config.options import option

# The trainer's flags the launcher consumes (the recipe it fills in, the
# config it prints) rather than forwards.
CONSUMED_TRAINER_FLAGS = {'config': str, 'print_config': bool}
MAX_WORKERS_PER_HOST = 1024


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
  """How a training job is started: workers, restarts, input servers."""
  num_workers_per_hls: int = option(
      1,
      'Workers (processes) per host (the reference\'s name: an HLS is a '
      'Habana host; its hosts list is MULTI_HLS_IPS). More than one worker '
      'in total runs them with mpirun; needs --use_horovod or '
      '--distribution_strategy=multi_worker_mirrored.',
      # Each worker of a host takes a port above TF_BASE_PORT and a share
      # of its cores: no host has cores (or GPUs) for more.
      within=f'[1, {MAX_WORKERS_PER_HOST}]',
      note='(one process per GPU or group of cores)')
  horovod_hierarchical_allreduce: bool = option(
      False,
      'Set HOROVOD_HIERARCHICAL_ALLREDUCE=1 (allreduce within each host '
      'first; for multi-host Horovod).')
  kubernetes_run: bool = option(
      False,
      'Each rank is already started by an external launcher (e.g. a '
      'Kubeflow MPIJob): run this rank in-process, without mpirun.')
  launcher: str = option(
      'auto',
      'How workers start: slurm: as the tasks of an srun step inside a Slurm '
      'allocation (sbatch, salloc), on its nodes; ssh: mpirun over ssh on '
      'the hosts of MULTI_HLS_IPS (or on this host); auto: slurm inside an '
      'allocation (SLURM_JOB_ID set), ssh otherwise.',
      choices=('auto', 'ssh', 'slurm'), checked_by_flag=True,
      in_recipe=False)
  slurm_nodes: int = option(
      0,
      'The nodes the batch script that --dry_run --launcher=slurm prints '
      'outside an allocation asks for (0: the hosts of MULTI_HLS_IPS, or 1).',
      within='>= 0', in_recipe=False)
  dry_run: bool = option(
      False,
      'Print the command(s), environment, per-worker TF_CONFIG and '
      'pre-flight checks, then exit without running anything.',
      in_recipe=False)
  max_restarts: int = option(
      0,
      'Start the whole job again, up to this many times, when it fails for '
      'a reason a rerun can fix (a lost worker or host, a network failure, '
      'a signal to one rank); the workers resume from the last checkpoint '
      '(--checkpoint_interval_steps bounds what is lost). Usage errors, a '
      'non-finite loss and a signal to the launcher are never retried.',
      within='>= 0', in_recipe=False)
  min_hosts: int = option(
      0,
      'Elastic job: the fewest hosts (of MULTI_HLS_IPS, or a Slurm '
      'allocation\'s nodes) it may go on with (0: '
      'all of them, fail-stop). At start a host that fails the pre-flight '
      'check is left out, named; after a failure a rerun can fix (up to '
      '--max_restarts times) every host is checked again and the job '
      'restarts from the last checkpoint on those that pass, so a lost host '
      'is dropped. While it runs on fewer hosts, the dropped ones are '
      'checked every few seconds, and one that answers again rejoins: the '
      'workers save at the next step and the job restarts with it (not a '
      'failure: --max_restarts is not used); a host dropped again waits a '
      'cool-down first, 10 s doubling to 100 s. The global batch is kept '
      '(see --elastic_batch). The chief is the first host left: '
      '--model_dir must be on storage every host shares.',
      within='>= 0', checked_by_flag=True, in_recipe=False)
  max_membership_changes_per_hour: int = option(
      10,
      'Elastic job: a host rejoins only while the job\'s hosts changed '
      '(dropped or rejoined) fewer than this many times in the last hour; '
      'each change restarts the workers, so hosts that come and go cannot '
      'keep the job restarting (0: a dropped host rejoins only at a '
      'restart after a failure).',
      within='>= 0', in_recipe=False)
  elastic_batch: str = option(
      elastic.KEEP,
      'How an elastic job on fewer hosts splits its batch: keep: the '
      'planned global batch, each worker taking a larger share (in '
      'micro-batches no larger than planned), so the schedule and result '
      'are the planned run\'s (the worker count must divide it; checked at '
      'start); scale: each worker keeps its batch, the global batch shrinks '
      'with the workers and the learning rate with it (linear scaling; the '
      'trainer gets --planned_global_batch).',
      choices=elastic.MODES, checked_by_flag=True, in_recipe=False)
  data_service_hosts: Tuple[str, ...] = option(
      (),
      'Run the training input pipeline on these hosts (comma-separated): a '
      'tf.data service dispatcher on the first, a data worker on each, '
      'started over ssh (DOCKER_SSHD_PORT) before training and stopped '
      'after; the trainer gets --tf_data_service.',
      in_recipe=False)
  data_service_port: int = option(
      launch.DEFAULT_DATA_SERVICE_PORT,
      'The dispatcher\'s port; data workers listen on the next one.',
      within='[1, 65534]', checked_by_flag=True, in_recipe=False)
  data_service_work_dir: str = option(
      '',
      'The dispatcher\'s journal on its host: a dispatcher restarted with '
      'it resumes its jobs. Empty: a new name for each launch in the '
      'host\'s temporary directory (resnet_keras_data_service_<random>), '
      'never a shared default.',
      in_recipe=False)
  port_guard: str = option(
      'auto',
      'Close the job\'s servers (multi_worker_mirrored\'s and the tf.data '
      'service\'s gRPC ports, OpenMPI\'s daemons), which listen on every '
      'interface without authentication, to every address but the job\'s '
      'hosts and loopback: iptables rules on each host (this one, ssh hosts; '
      'not under Slurm or Kubernetes), removed when the job ends. auto: '
      'where it can (root, iptables), saying in one line what it did or why '
      'not; on: fail where it cannot; off: leave them open '
      '(docs/security.md).',
      choices=('auto', 'on', 'off'), checked_by_flag=True, in_recipe=False)
  failure_timeout: int = option(
      worker_contract.DEFAULT_FAILURE_TIMEOUT,
      'Seconds within which a lost host or rank ends a multi-worker job '
      '(mpirun\'s keepalive probes). A rank alive but stuck ends it within '
      '10x this (Horovod\'s stall check; each worker\'s watchdog on its '
      'collectives while it starts, evaluates, checkpoints or exports), and '
      'in training within 4x the 99th percentile of its step times, at '
      'least 20 s.',
      in_recipe=False)

  def check(self) -> None:
    options.check_fields(self, LaunchConfig)
    hosts = [hosts_lib.check_host(host, '--data_service_hosts')
             for host in self.data_service_hosts]
    worker_contract.check_distinct(hosts, '--data_service_hosts')


FIELDS = tuple(f.name for f in dataclasses.fields(LaunchConfig))
# What a recipe may hold of the launcher's: the trainer refuses these keys
# with a hint to use the launcher.
RECIPE_KEYS = tuple(f.name for f in dataclasses.fields(LaunchConfig)
                    if options.spec_of(f).in_recipe)
# Never forwarded to the trainer, in any absl spelling.
_FLAG_TYPES = {**{f.name: options.field_type(LaunchConfig, f.name)
                  for f in dataclasses.fields(LaunchConfig)},
               **CONSUMED_TRAINER_FLAGS}
BOOLEAN_FLAGS = tuple(n for n, kind in _FLAG_TYPES.items() if kind is bool)
VALUED_FLAGS = tuple(n for n, kind in _FLAG_TYPES.items() if kind is not bool)


def define_flags(values: flags.FlagValues) -> None:
  """The trainer's flags (forwarded to it) and the launcher's own."""
  flags_lib.define_flags(values)
  flags_lib.define_options(values, [LaunchConfig])


def from_flags(values: flags.FlagValues) -> LaunchConfig:
  """The launcher's options from parsed flags (a recipe applied), checked."""
  cfg = LaunchConfig(**{name: _value(values[name].value) for name in FIELDS})
  cfg.check()
  return cfg


def _value(value: Any) -> Any:
  return tuple(value) if isinstance(value, list) else value


def recipe_values(cfg: LaunchConfig) -> Dict[str, Any]:
  """The launcher settings --print_config writes beside the trainer's."""
  return {name: getattr(cfg, name) for name in RECIPE_KEYS}


def as_parsed(argv: Sequence[str], values: flags.FlagValues) -> List[str]:
  """The launcher's command line `argv` as absl parsed it into `values`:
  each --flagfile replaced by the flags it holds (the launcher's among
  them are the launcher's), and each flag's value joined to its name
  (`--model_dir=--dry_run`), so that taking out the launcher's flags never
  takes a value for a flag. Spellings are kept (-bs=256 for -bs 256)."""
  args = iter(values.read_flags_from_files(list(argv[1:]), force_gnu=False))
  out = [argv[0]]
  for arg in args:
    if arg == '--' or not arg.startswith('-'):
      out += [arg, *args]  # Positional arguments: absl stops here too.
      break
    name = arg.lstrip('-')
    if '=' not in name and name in values and not values[name].boolean:
      arg = f'{arg}={next(args, "")}'
    out.append(arg)
  return out


def strip(args: Sequence[str]) -> list:
  """`args` without the launcher's flags: what is forwarded to the trainer."""
  return launch.strip_flags(args, BOOLEAN_FLAGS, VALUED_FLAGS)

