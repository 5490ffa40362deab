"""The worker contract: every environment variable the launcher and a
scheduler hand to a worker is named here, and nowhere else. The launcher
writes them through these functions; the trainer reads them through them
(as torchelastic's workers read RANK, WORLD_SIZE and
TORCHELASTIC_RESTART_COUNT).

  MULTI_HLS_IPS            the job's hosts, in rank order (`hosts`)
  TF_BASE_PORT, TF_CONFIG  multi_worker_mirrored: the ports a host's workers
                           listen on, and each rank's cluster, derived from
                           its MPI or Slurm rank where none is set
  OMPI_COMM_WORLD_*, PMI_*, PMIX_*, SLURM_PROCID/SLURM_STEP_NUM_TASKS
                           the rank and world size (`mpi_rank_and_size`)
  RESNET_KERAS_RESTARTS, RESNET_KERAS_RESUME_STEP
                           each attempt's restarts before it and the step it
                           resumes at (`attempt_env`)
  RESNET_KERAS_COLLECTIVE_TIMEOUT, HOROVOD_STALL_*
                           when a stuck rank ends the job (`failure_env`)
  HOROVOD_HIERARCHICAL_ALLREDUCE
  RESNET_KERAS_ONEDNN_DEFAULTED
                           oneDNN on by our default, not the user's (env.py)
  SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_STEP_NODELIST,
  SLURM_TASKS_PER_NODE, SLURM_RESTART_COUNT
                           what a Slurm job tells its processes: the
                           allocation, its nodes, and its requeues

Pure functions of the environment they are given. The launcher and the
trainer read the numbers among them once before any work
(`check_environment`): a value set wrong is one line naming it.
"""

import json
import os
import socket
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from common import hosts as hosts_lib
from common import slurm
from common.errors import UsageError

HOSTS_VAR = 'MULTI_HLS_IPS'
TF_BASE_PORT_VAR = 'TF_BASE_PORT'
TF_CONFIG_VAR = 'TF_CONFIG'
# The prefix of the variables of this project's own.
OWN_PREFIX = 'RESNET_KERAS_'
# What the supervisor tells each attempt's workers (mpirun forwards both):
# how many times the job was restarted before it, and the step of the
# checkpoint it resumes at (empty on the first attempt). The trainer applies
# --clean on the first attempt only, and refuses to train from any other
# step than the one the launcher announced.
RESTARTS_VAR = 'RESNET_KERAS_RESTARTS'
RESUME_STEP_VAR = 'RESNET_KERAS_RESUME_STEP'
# And which job the attempt is of: the same for each attempt of one job (a
# Slurm job's requeues too), so that an attempt takes the run directory
# over from its job's earlier attempt (resnet_keras/rundir/run_lock.py).
JOB_VAR = 'RESNET_KERAS_JOB'
ATTEMPT_VARS = (RESTARTS_VAR, RESUME_STEP_VAR, JOB_VAR)
# multi_worker_mirrored: seconds a worker waits on the others' collectives
# (its stuck-worker watchdog's, and the workers' last barrier).
COLLECTIVE_TIMEOUT_VAR = 'RESNET_KERAS_COLLECTIVE_TIMEOUT'
# Horovod's stall check: seconds before it names a rank missing from a
# collective, and before it shuts the job down (and ours: the trainer's
# collective watchdog, resnet_keras/training/watchdog.py, ends a worker then).
HOROVOD_STALL_CHECK_VAR = 'HOROVOD_STALL_CHECK_TIME_SECONDS'
HOROVOD_STALL_SHUTDOWN_VAR = 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'
# Marks a TF_ENABLE_ONEDNN_OPTS this package set (common/env.py), as opposed
# to the user. The launcher forwards it with the variable, so every rank it
# starts reports the same reason.
ONEDNN_DEFAULTED_VAR = 'RESNET_KERAS_ONEDNN_DEFAULTED'
HIERARCHICAL_ALLREDUCE_VAR = 'HOROVOD_HIERARCHICAL_ALLREDUCE'
SLURM_JOB_ID_VAR = 'SLURM_JOB_ID'
SLURM_JOB_NODELIST_VAR = 'SLURM_JOB_NODELIST'
SLURM_TASKS_PER_NODE_VAR = 'SLURM_TASKS_PER_NODE'
SLURM_RESTART_COUNT_VAR = 'SLURM_RESTART_COUNT'
# Rank and world size as the common MPI launchers publish them.
# Last, Slurm's, of a task of an srun step (a batch script has no step).
_RANK_VARS = (('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
              ('PMI_RANK', 'PMI_SIZE'), ('PMIX_RANK', 'PMIX_SIZE'),
              ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS'))
# The pairs whose launchers always set both (PMIx sets no PMIX_SIZE; a
# Slurm batch script has a SLURM_PROCID and no step).
_PAIRED_RANK_VARS = ('OMPI_COMM_WORLD_RANK', 'PMI_RANK')

DEFAULT_TF_BASE_PORT = 2410
DEFAULT_FAILURE_TIMEOUT = 60
# A rank alive but stuck (not a lost one) ends the job after this many
# failure timeouts at the most: long enough for the chief's pauses
# (checkpoint, export) that the other workers wait through. In training the
# workers' watchdogs end it sooner, from the step times they measure
# (resnet_keras/training/watchdog.py Deadlines).
_STALL_SHUTDOWN_FACTOR = 10


def parse_hosts(multi_hls_ips: Optional[str]) -> List[str]:
  """MULTI_HLS_IPS ('ip1,ip2,...') -> host list; empty: this host only."""
  if not multi_hls_ips:
    return []
  hosts = [hosts_lib.check_host(h.strip(), HOSTS_VAR)
           for h in multi_hls_ips.split(',') if h.strip()]
  # What this host's names and hosts file say is the launcher's to check:
  # on another host of the job they name another host.
  check_distinct(hosts, HOSTS_VAR, here=False)
  return hosts


def check_distinct(hosts: Sequence[str], source: str,
                   here: bool = True) -> None:
  """UsageError where two of `hosts` are one host: their workers would
  listen on the same ports there. `here`: as this host knows them too (its
  own name, its hosts file)."""
  twice = (hosts_lib.same_host(hosts) if here else
           hosts_lib.same_host(hosts, etc_hosts={}, this_name=''))
  if twice:
    first, second = twice
    said = (f'lists {first} twice' if first == second else
            f'names one host twice ({first} and {second})')
    raise UsageError(f'{source} {said}: their servers would listen on the '
                     'same ports there; give each host once')


def hosts(environ: Mapping[str, str]) -> List[str]:
  """The job's hosts (MULTI_HLS_IPS); empty: this host only."""
  return parse_hosts(environ.get(HOSTS_VAR))


def hosts_env(job_hosts: Sequence[str]) -> Dict[str, str]:
  """What tells the workers the job's hosts."""
  return {HOSTS_VAR: ','.join(job_hosts)}


def this_host(environ: Mapping[str, str]) -> Dict[str, str]:
  """This process's hostname and the address it reaches the job's first
  host from (MULTI_HLS_IPS; its own address on that network), for the run's
  record of where each worker ran."""
  job_hosts = hosts(environ)
  address = ''
  if job_hosts:
    try:
      address = hosts_lib.address_toward(job_hosts[0])
    except OSError:
      pass
  return {'hostname': socket.gethostname(), 'address': address}


def attempt_env(restarts: int, resume_step: Optional[int],
                job: str = '') -> Dict[str, str]:
  """What an attempt's workers are told: the restarts before it, the step
  it resumes at (None: not a restart) and the job's identity."""
  return {RESTARTS_VAR: str(restarts),
          RESUME_STEP_VAR: '' if resume_step is None else str(resume_step),
          JOB_VAR: job}


def new_job_identity(environ: Mapping[str, str]) -> str:
  """A job's identity, made once by its launcher: its Slurm job (whose
  requeues start the launcher again), or this launcher's host, PID and
  start."""
  if in_slurm_allocation(environ):
    return f'slurm-{slurm_job_id(environ)}'
  return f'{socket.gethostname()}-{os.getpid()}-{time.time():.0f}'


def job_identity(environ: Mapping[str, str]) -> Optional[str]:
  """The job this process is an attempt of (None: none said, as for a
  trainer started by hand): the launcher's, or a Slurm job's."""
  if environ.get(JOB_VAR):
    return environ[JOB_VAR]
  return new_job_identity(environ) if in_slurm_allocation(environ) else None


def restart_count(environ: Mapping[str, str]) -> int:
  """How many times the launcher restarted this job before this attempt."""
  return _count(environ, RESTARTS_VAR) or 0


def requeues(environ: Mapping[str, str]) -> int:
  """How many times the scheduler requeued this job before (Slurm's
  SLURM_RESTART_COUNT): the batch script, and the launcher in it, run again
  from the start."""
  return _count(environ, SLURM_RESTART_COUNT_VAR) or 0


def _count(environ: Mapping[str, str], name: str,
           lowest: int = 0) -> Optional[int]:
  """Variable `name` as a whole number from `lowest` (None: unset or
  empty); UsageError naming it otherwise."""
  value = environ.get(name, '').strip()
  if not value:
    return None
  if not value.isdigit() or int(value) < lowest:
    owner = ('the launcher' if name.startswith(OWN_PREFIX) else
             'its launcher or scheduler')
    raise UsageError(f'{name}={environ[name]!r} is not a whole number from '
                     f'{lowest}: {owner} sets it; unset it (or fix it) in '
                     'the environment this ran from')
  return int(value)


def check_environment(environ: Mapping[str, str]) -> None:
  """The numbers the launcher and the schedulers hand a worker (its rank
  and world size, restarts, requeues, the step it resumes at), read once
  before any work: a value set half or wrong is one line naming it."""
  for name in (RESTARTS_VAR, RESUME_STEP_VAR, SLURM_RESTART_COUNT_VAR):
    _count(environ, name)
  for rank_var, size_var in _RANK_VARS:
    rank = _count(environ, rank_var)
    size = _count(environ, size_var, lowest=1)
    if rank_var in _PAIRED_RANK_VARS and (rank is None) != (size is None):
      given, missing = ((rank_var, size_var) if size is None else
                        (size_var, rank_var))
      raise UsageError(f'{given} is set without {missing}: an MPI launcher '
                       'sets both; unset it in the environment this ran '
                       'from')
  mpi_rank_and_size(environ)


def earlier_attempts(environ: Mapping[str, str]) -> int:
  """Attempts of this job before this one: the launcher's restarts and
  the scheduler's requeues. --clean applies only where there were none."""
  return restart_count(environ) + requeues(environ)


def resume_step(environ: Mapping[str, str]) -> Optional[int]:
  """The step of the checkpoint the launcher restarted this attempt to
  resume at (0: it saw none), or None (a first attempt, or no launcher)."""
  return _count(environ, RESUME_STEP_VAR)


def failure_env(failure_timeout: int, use_horovod: bool) -> Dict[str, str]:
  """What the workers need to end a stuck job themselves.

  Horovod: its stall check names the ranks that have not joined a collective
  after `failure_timeout` seconds, and shuts the job down after
  _STALL_SHUTDOWN_FACTOR times that, as each worker's watchdog does
  (resnet_keras/training/watchdog.py). multi_worker_mirrored: the same time
  for its watchdog.
  """
  shutdown = str(stuck_rank_timeout(failure_timeout))
  if use_horovod:
    return {HOROVOD_STALL_CHECK_VAR: str(failure_timeout),
            HOROVOD_STALL_SHUTDOWN_VAR: shutdown}
  return {COLLECTIVE_TIMEOUT_VAR: shutdown}


def hierarchical_allreduce_env() -> Dict[str, str]:
  """Horovod's hierarchical allreduce, on."""
  return {HIERARCHICAL_ALLREDUCE_VAR: '1'}


def stuck_rank_timeout(failure_timeout: int) -> int:
  """Seconds after which a rank alive but stuck ends the job."""
  return failure_timeout * _STALL_SHUTDOWN_FACTOR


def collective_timeout(environ: Mapping[str, str]) -> Optional[float]:
  """multi_worker_mirrored's wait on the others in seconds (None: none)."""
  return _seconds(environ, COLLECTIVE_TIMEOUT_VAR)


def stuck_worker_timeout(environ: Mapping[str, str],
                         use_horovod: bool) -> Optional[float]:
  """Seconds after which a worker waiting on a stuck one ends (None: the
  launcher set none): Horovod's stall shutdown time, multi_worker_mirrored's
  wait on the others."""
  return _seconds(environ, HOROVOD_STALL_SHUTDOWN_VAR if use_horovod
                  else COLLECTIVE_TIMEOUT_VAR)


def _seconds(environ: Mapping[str, str], name: str) -> Optional[float]:
  value = environ.get(name)
  try:
    return float(value) if value else None
  except ValueError:
    raise UsageError(f'{name}={value} is not a number of seconds') from None


def mpi_rank_and_size(environ: Mapping[str, str]):
  """(rank, size) from an MPI launcher's environment, or None: the first
  pair of _RANK_VARS set whole."""
  for rank_var, size_var in _RANK_VARS:
    if environ.get(rank_var) and environ.get(size_var):
      rank = _count(environ, rank_var)
      size = _count(environ, size_var, lowest=1)
      if rank >= size:
        raise UsageError(f'{rank_var}={rank} is not a rank of '
                         f'{size_var}={size} workers: its launcher sets '
                         'both; unset them (or fix them) in the environment '
                         'this ran from')
      return rank, size
  return None


def several_workers(environ: Mapping[str, str]) -> bool:
  """Whether this process is one worker of several (TF_CONFIG, or an MPI
  world of more than one)."""
  ranks = mpi_rank_and_size(environ)
  return bool(tf_config(environ)) or bool(ranks and ranks[1] > 1)


def worker_index(environ: Mapping[str, str]) -> int:
  """This worker's index before its backend is built: TF_CONFIG's task
  index, else the MPI rank, else 0 (the backend's own index agrees)."""
  config = tf_config(environ)
  if config:
    try:
      return int(json.loads(config)['task']['index'])
    except (ValueError, KeyError, TypeError):
      return 0  # A malformed TF_CONFIG is the backend's to report.
  ranks = mpi_rank_and_size(environ)
  return ranks[0] if ranks else 0


def tf_config_for_rank(rank: int, size: int, job_hosts: Sequence[str],
                       base_port: int = DEFAULT_TF_BASE_PORT) -> Dict:
  """TF_CONFIG of worker `rank` among `size`, laid out as mpirun places them.

  mpirun fills each host's slots before the next host, so rank r runs on
  host r // per_host with local rank r % per_host, and listens on
  base_port + local rank (several workers share a host).
  """
  job_hosts = list(job_hosts) or ['localhost']
  if size % len(job_hosts):
    raise UsageError(f'{size} workers cannot be spread evenly over '
                     f'{len(job_hosts)} hosts in {HOSTS_VAR}')
  per_host = size // len(job_hosts)
  workers = [hosts_lib.host_port(job_hosts[r // per_host],
                                 base_port + r % per_host)
             for r in range(size)]
  return {'cluster': {'worker': workers},
          'task': {'type': 'worker', 'index': rank}}


def tf_base_port(environ: Mapping[str, str], workers_per_host: int) -> int:
  """TF_BASE_PORT (default DEFAULT_TF_BASE_PORT), checked: a host's
  workers listen on it and the `workers_per_host` - 1 ports above it."""
  value = environ.get(TF_BASE_PORT_VAR, str(DEFAULT_TF_BASE_PORT))
  highest = 65536 - max(1, workers_per_host)
  if highest < 1:
    raise UsageError(f'{workers_per_host} workers per host would each listen '
                     'on a port of its own; a host has 65,535: start fewer')
  try:
    port = int(value)
  except ValueError:
    port = None
  if port is None or not 1 <= port <= highest:
    raise UsageError(f'{TF_BASE_PORT_VAR}={value}: the {workers_per_host} '
                     'worker(s) of a host listen on it and the ports above '
                     f'it; give a port number from 1 to {highest}')
  return port


def tf_config_from_env(rank: int, size: int,
                       environ: Mapping[str, str]) -> Dict:
  """TF_CONFIG of worker `rank`, hosts from MULTI_HLS_IPS, ports from
  TF_BASE_PORT."""
  job_hosts = hosts(environ)
  base_port = tf_base_port(environ, size // max(1, len(job_hosts)))
  return tf_config_for_rank(rank, size, job_hosts, base_port)


def tf_config_from_mpi(environ: Mapping[str, str]) -> Optional[str]:
  """The TF_CONFIG (JSON) this MPI rank should use, or None outside MPI."""
  rank_size = mpi_rank_and_size(environ)
  if rank_size is None:
    return None
  return json.dumps(tf_config_from_env(*rank_size, environ))


def tf_config(environ: Mapping[str, str]) -> str:
  """The TF_CONFIG set for this process ('': none)."""
  return environ.get(TF_CONFIG_VAR, '')


def tf_config_task(environ: Mapping[str, str]) -> Tuple[str, int, str, int]:
  """(task type, index, host, port) of this process in its TF_CONFIG, every
  address of the cluster checked first: TensorFlow reads an address it
  cannot use (an IPv6 one without brackets) and then waits for good, deaf
  to SIGTERM."""
  text = tf_config(environ)
  try:
    config = json.loads(text)
    cluster, task = config['cluster'], config['task']
    kind, index = task['type'], int(task['index'])
    addresses = {name: list(cluster[name]) for name in cluster}
    if not 0 <= index < len(addresses[kind]):
      raise IndexError(index)
  except (ValueError, KeyError, IndexError, TypeError):
    raise UsageError(f'{TF_CONFIG_VAR} is not a valid cluster description '
                     f'({text[:200]}); see docs/multi_host.md, '
                     '"The launcher"') from None
  host = port = None
  for name, tasks in addresses.items():
    for i, each in enumerate(tasks):
      parsed = hosts_lib.split_host_port(
          str(each), f'{TF_CONFIG_VAR}\'s {name} {i}')
      if (name, i) == (kind, index):
        host, port = parsed
  return kind, index, host, port


def ensure_tf_config(environ) -> Optional[str]:
  """Sets `environ`'s TF_CONFIG from the MPI rank when none is set (a
  TF_CONFIG the user set is used as is); the one it set, or None."""
  if tf_config(environ):
    return None
  derived = tf_config_from_mpi(environ)
  if derived:
    environ[TF_CONFIG_VAR] = derived
  return derived


def in_slurm_allocation(environ: Mapping[str, str]) -> bool:
  return bool(environ.get(SLURM_JOB_ID_VAR))


def slurm_job_id(environ: Mapping[str, str]) -> str:
  return environ[SLURM_JOB_ID_VAR]


def slurm_job_nodes(environ: Mapping[str, str]) -> List[str]:
  """The nodes of the Slurm job, as allocated."""
  return slurm.expand_nodelist(environ.get(SLURM_JOB_NODELIST_VAR, ''))


def slurm_step_nodes(environ: Mapping[str, str]) -> List[str]:
  """The nodes of the step this process is a task of (a batch script, in
  no step: the job's, as it was allocated)."""
  return slurm.expand_nodelist(environ.get('SLURM_STEP_NODELIST') or
                               environ.get(SLURM_JOB_NODELIST_VAR, ''))


def slurm_tasks_per_node(environ: Mapping[str, str]) -> str:
  """SLURM_TASKS_PER_NODE as Slurm writes it ('2(x3),1'; '': unset)."""
  return environ.get(SLURM_TASKS_PER_NODE_VAR, '')
