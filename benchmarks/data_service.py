"""What a tf.data service data worker on another host buys an input-bound
trainer, on the test suite's network-namespace cluster (tests/cluster.py).

Two hosts, each pinned to one core of this machine (taskset): the trainer on
h1 (core 0); the dispatcher and one data worker on h2 (core 1). JPEG records
of ImageNet's typical size (random texture, benchmarks/input_pipeline.py's
writer). Each case is a short training run; its run_summary gives the
steady images/s and the share of time steps waited for input:

  local    the trainer decodes and augments on its own core
  service  the same pipeline on h2's data worker (--tf_data_service)

for an input-bound job (a cheap model) and for one that is not (a model
that costs more than the decoding), alternately, --pairs times.

  python -m benchmarks.data_service [--pairs 2] [--work_dir /tmp/dsbench]

Needs root (network namespaces), like the multi-host tests.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks import hardware  # pylint: disable=g-import-not-at-top
from benchmarks.input_pipeline import write_shards  # pylint: disable=g-import-not-at-top
from testbed import cluster as cluster_lib

MAIN = os.path.join(REPO_ROOT, 'resnet_ctl_imagenet_main.py')
PORT = 5050
JOBS = {
    # (flags, steps). Measured alone on one core of a 2-core EPYC: the
    # pipeline delivers ~1,800 img/s at 64 px, this model trains ~2,200:
    # decoding dominates.
    'input-bound': (['--resnet_depth=10', '--width_multiplier=0.25',
                     '--image_size=64'], 100),
    # ~100 img/s: decoding is a tenth of a step.
    'compute-bound': (['--resnet_depth=18', '--width_multiplier=0.5',
                       '--image_size=128'], 30),
}


def write_records(data_dir: str, train_images: int) -> None:
  if os.path.isdir(os.path.join(data_dir, 'validation')):
    return
  write_shards(data_dir, num_shards=8, per_shard=train_images // 8)
  staging = os.path.join(data_dir, 'staging')
  write_shards(staging, num_shards=1, per_shard=64, seed=1)
  os.makedirs(os.path.join(data_dir, 'validation'))
  os.replace(os.path.join(staging, 'train', 'train-00000-of-00001'),
             os.path.join(data_dir, 'validation',
                          'validation-00000-of-00001'))
  shutil.rmtree(staging)


def train(cluster, host, job, data_dir, model_dir, service=None):
  """One pinned training run; its run summary. `data_dir` None: synthetic
  data (the model alone)."""
  flags, steps = JOBS[job]
  data = ([f'--data_dir={data_dir}'] if data_dir else
          ['--use_synthetic_data', '--num_classes=1000'])
  args = flags + data + [
      f'--model_dir={model_dir}', '--clean',
      '--batch_size=128', f'--train_steps={steps}', '--steps_per_loop=10',
      f'--log_steps={steps}', '--skip_eval',
      '--data_loader_image_type=uint8', '--dtype=fp32']
  if service:
    args += [f'--tf_data_service={service}']
  result = subprocess.run(
      cluster.enter(host) + ['taskset', '-c', '0', sys.executable, MAIN] +
      args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
  if result.returncode:
    raise RuntimeError(result.stderr[-3000:])
  with open(os.path.join(model_dir, 'run_summary.json')) as f:
    return json.load(f)


def start_service(cluster, host, work_dir):
  """Dispatcher and one data worker on `host`, both on core 1."""
  servers = []
  for role, args in (('dispatcher', ['--port', str(PORT)]),
                     ('worker', ['--port', str(PORT + 1), '--dispatcher',
                                 f'{host.address}:{PORT}'])):
    log = open(os.path.join(work_dir, f'{role}.log'), 'w')
    servers.append(cluster.popen(
        host, ['taskset', '-c', '1', sys.executable, '-m',
               'resnet_keras.data.service', role] + args,
        env=dict(os.environ), cwd=REPO_ROOT, stdout=log,
        stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 120
    while 'ready at' not in open(log.name).read():
      if time.monotonic() > deadline or servers[-1].poll() is not None:
        raise RuntimeError(open(log.name).read()[-2000:])
      time.sleep(0.2)
  return servers


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--work_dir', default='/tmp/data_service_benchmark')
  parser.add_argument('--train_images', type=int, default=2048)
  parser.add_argument('--pairs', type=int, default=2)
  args = parser.parse_args()
  print(hardware.machine_line())
  data_dir = os.path.join(args.work_dir, 'records')
  write_records(data_dir, args.train_images)
  cluster = cluster_lib.Cluster(
      2, state_dir=f'/run/resnet_keras_dsbench_{os.getpid()}',
      subnet_index=200 + os.getpid() % 50).start()
  servers = []
  try:
    h1, h2 = cluster.hosts
    servers = start_service(cluster, h2, args.work_dir)
    address = f'grpc://{h2.address}:{PORT}'
    results = {}
    cases = (('model alone', None, None), ('local', data_dir, None),
             ('service', data_dir, address))
    for _ in range(args.pairs):
      for job in JOBS:
        for case, data, service in cases:
          summary = train(cluster, h1, job, data,
                          os.path.join(args.work_dir, 'model'), service)
          results.setdefault((job, case), []).append(
              (summary['avg_exp_per_second'], summary['input_wait_fraction']))
          print(f'{job:<14} {case:<8} {summary["avg_exp_per_second"]:7.1f} '
                f'img/s, input wait {100 * summary["input_wait_fraction"]:3.0f}%',
                flush=True)
    # Waiting: the share of a step not spent on the model, 1 - img/s over
    # the model alone's (the step log's own input wait is printed too; on a
    # process pinned to one core it reads high even on synthetic data).
    print(f'\n{"job":<14} {"input":<12} {"img/s (median)":>15} '
          f'{"waiting":>8} {"logged wait":>12} {"vs local":>9}')
    for job in JOBS:
      median = lambda case, i: statistics.median(
          r[i] for r in results[(job, case)])
      for case, _, _ in cases:
        rate = median(case, 0)
        print(f'{job:<14} {case:<12} {rate:>15.1f} '
              f'{100 * (1 - rate / median("model alone", 0)):>7.0f}% '
              f'{100 * median(case, 1):>11.0f}% '
              f'{rate / median("local", 0):>8.2f}x')
  finally:
    for server in servers:
      server.terminate()
    cluster.stop()


if __name__ == '__main__':
  main()
