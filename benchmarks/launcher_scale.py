"""The launcher's own cost at 3, 100 and 1,000 hosts: the real launcher
(demo_resnet_keras.py) against stand-ins for ssh, mpirun, srun and
scontrol (testbed/standins.py) that answer after --delay seconds, under
each placement (ssh hosts from MULTI_HLS_IPS, a Slurm allocation) and
backend. Each case is one launch whose first attempt loses its last host
(elastic, --min_hosts one fewer, --max_restarts=1), sampled with psutil:

  start     seconds from the launcher's start to its first mpirun/srun
  CPU       the launcher's own CPU seconds until then (the stand-ins, 60 ms
            of Python each, share the 2 cores and lengthen `start`)
  replan    seconds from that attempt's end to the next one's start (the
            supervisor's reading, the hosts checked again, the new split)
  threads, processes (all its descendants), RSS MiB: the launcher's peaks
            before the workers start (the pre-flight's share of them)
  ssh       most pre-flight ssh sessions open at once
  dry run   --dry_run's output, bytes, and its seconds

The stand-in hosts are 127.0.0.0/8 addresses and Slurm node names; nothing
leaves this host. The launches pass --port_guard=off: as root the guard's
ssh to each host would be a second pre-flight (under the same cap). --sessions also starts the ssh sessions mpirun keeps for
the job's life (OpenMPI's rsh launch: 64 with its tree spawn, one per host
with --no_tree_spawn), to count what they hold.

  python -m benchmarks.launcher_scale --hosts=3,100,1000
"""

import os
import platform
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

from testbed import standins

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEMENTS = ('ssh', 'slurm')
BACKENDS = ('horovod', 'multi_worker_mirrored')

flags.DEFINE_list('hosts', ['3', '100', '1000'], 'Host counts.')
flags.DEFINE_list('placements', list(PLACEMENTS), 'ssh, slurm.')
flags.DEFINE_list('backends', list(BACKENDS),
                  'horovod, multi_worker_mirrored.')
flags.DEFINE_float('delay', 0.2, 'Seconds each stand-in takes to answer.')
flags.DEFINE_bool('sessions', False,
                  'mpirun keeps its ssh sessions for the job (ssh only).')
flags.DEFINE_bool('no_tree_spawn', False,
                  'With --sessions: OpenMPI without its tree spawn, one '
                  'ssh session per host on the launcher\'s host.')
flags.DEFINE_float('job_seconds', 3, 'How long the job runs with --sessions.')
FLAGS = flags.FLAGS


def cpu_name() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def environment(placement: str, hosts: int, bin_dir: str, records: str):
  env = {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}',
         'STANDIN_DIR': records, 'STANDIN_DELAY': str(FLAGS.delay)}
  for name in ('SLURM_JOB_ID', 'SLURM_JOB_NODELIST', 'MULTI_HLS_IPS'):
    env.pop(name, None)
  if placement == 'ssh':
    # 127.0.1.1 ... : loopback, and no host name to look up.
    names = [f'127.0.{1 + i // 250}.{1 + i % 250}' for i in range(hosts)]
    env['MULTI_HLS_IPS'] = ','.join(names)
  else:
    width = len(str(hosts))
    names = [f'n{str(i).zfill(width)}' for i in range(1, hosts + 1)]
    env.update({'SLURM_JOB_ID': '7',
                'SLURM_JOB_NODELIST': f'n[{"1".zfill(width)}-{hosts}]',
                'SLURM_TASKS_PER_NODE': f'1(x{hosts})'})
  return env, names


def launcher_args(backend: str, hosts: int, model_dir: str):
  # A global batch every count from hosts - 1 to hosts divides (keep).
  batch = hosts - 1 if backend == 'horovod' else hosts * (hosts - 1)
  args = [sys.executable, 'demo_resnet_keras.py', f'--model_dir={model_dir}',
          f'--batch_size={batch}', '--port_guard=off', '--max_restarts=1',
          f'--min_hosts={hosts - 1}']
  return args + (['--use_horovod'] if backend == 'horovod' else
                 ['--distribution_strategy=multi_worker_mirrored'])


def sample(process: subprocess.Popen):
  """The launcher's peaks until its first mpirun or srun (a child of that
  name: a script's process is named after it), sampled every 50 ms, and
  its peaks after (mpirun's sessions among its descendants)."""
  launcher = psutil.Process(process.pid)
  before = {'threads': 0, 'processes': 0, 'rss': 0, 'cpu': 0}
  after = dict(before)
  started = False
  while process.poll() is None:
    time.sleep(0.05)
    try:
      children = launcher.children(recursive=True)
      figures = {'threads': launcher.num_threads(),
                 'processes': len(children),
                 'rss': launcher.memory_info().rss,
                 'cpu': sum(launcher.cpu_times()[:2])}
      started = started or any(child.name() in ('mpirun', 'srun')
                               for child in launcher.children())
    except psutil.NoSuchProcess:  # A child that ended meanwhile.
      continue
    peaks = after if started else before
    for name, value in figures.items():
      peaks[name] = max(peaks[name], value)
  return before, after


def one_case(placement, backend, hosts, bin_dir):
  with tempfile.TemporaryDirectory(prefix='launcher_scale_') as records:
    env, names = environment(placement, hosts, bin_dir, records)
    env['STANDIN_LOSE'] = names[-1]
    if FLAGS.sessions and placement == 'ssh':
      env['STANDIN_SESSIONS'] = '1'
      env['STANDIN_JOB_SECONDS'] = str(FLAGS.job_seconds)
      if FLAGS.no_tree_spawn:
        env['OMPI_MCA_plm_rsh_no_tree_spawn'] = '1'
    args = launcher_args(backend, hosts, os.path.join(records, 'run'))
    process = subprocess.Popen(args, cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    began = psutil.Process(process.pid).create_time()
    before, after = sample(process)
    stderr = process.stderr.read()
    if process.wait() != 0:  # A row that says why, the others go on.
      return {'failed': stderr.strip().splitlines()[-1][:300]}
    events = standins.events(records)
    jobs = [e for e in events if e['kind'] in ('mpirun', 'srun')]
    first_start, first_end, second_start = (jobs[0]['time'], jobs[1]['time'],
                                            jobs[2]['time'])
    ssh_open = max((e['open'] for e in events
                    if e['kind'] == 'ssh' and e['event'] == 'start'),
                   default=0)
    dry_start = time.monotonic()
    dry = subprocess.run(args + ['--dry_run'], cwd=REPO, env=env,
                         capture_output=True)
    dry_seconds = time.monotonic() - dry_start
    if dry.returncode:
      raise SystemExit(dry.stderr.decode()[-2000:])
  return {'start': first_start - began, 'replan': second_start - first_end,
          'cpu': before['cpu'], 'threads': before['threads'], 'processes': before['processes'],
          'rss': before['rss'] / 2**20, 'ssh': ssh_open,
          'dry_bytes': len(dry.stdout), 'dry_seconds': dry_seconds,
          'after_processes': after['processes'],
          'after_threads': after['threads'], 'after_rss': after['rss'] / 2**20}


def main(argv):
  del argv
  print(f'CPU: {cpu_name()}, {os.cpu_count()} cores; stand-ins answer after '
        f'{FLAGS.delay} s')
  print('| placement | backend | hosts | start s | CPU s | replan s | '
        'threads | processes | RSS MiB | ssh at once | dry run bytes | '
        'dry run s |')
  print('|---|---|---|---|---|---|---|---|---|---|---|---|')
  with tempfile.TemporaryDirectory(prefix='standins_') as bin_dir:
    standins.install(bin_dir)
    for hosts in map(int, FLAGS.hosts):
      for placement in FLAGS.placements:
        for backend in FLAGS.backends:
          r = one_case(placement, backend, hosts, bin_dir)
          if 'failed' in r:
            print(f'| {placement} | {backend} | {hosts} | the launch failed: '
                  f'{r["failed"]} |', flush=True)
            continue
          print(f'| {placement} | {backend} | {hosts} | {r["start"]:.2f} | '
                f'{r["cpu"]:.2f} | {r["replan"]:.2f} | {r["threads"]} | {r["processes"]} | '
                f'{r["rss"]:.0f} | {r["ssh"]} | {r["dry_bytes"]:,} | '
                f'{r["dry_seconds"]:.2f} |', flush=True)
          if FLAGS.sessions and placement == 'ssh':
            print(f'  while the job runs: {r["after_processes"]} processes '
                  f'under the launcher, {r["after_threads"]} threads, '
                  f'{r["after_rss"]:.0f} MiB RSS', flush=True)


if __name__ == '__main__':
  app.run(main)
