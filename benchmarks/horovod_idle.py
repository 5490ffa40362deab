"""CPU seconds Horovod's background thread spends while its workers do
nothing, per HOROVOD_CYCLE_TIME.

  python -m benchmarks.horovod_idle [--cycles 1,10] [--seconds 10]

For each cycle time, 2 workers under mpirun (one core each) initialise
Horovod, reduce one tensor, then sleep; each prints the CPU seconds its
process used during the sleep. At Horovod's default of 1 ms, one worker
waits in MPI_Allreduce (its cache coordination) for the other's next cycle
and OpenMPI polls all the while: about a core.
resnet_keras/engine/distribution.py sets 10 ms on hosts without a GPU.
"""

import argparse
import os
import re
import resource
import subprocess
import sys
import time

from benchmarks import hardware


def worker(seconds: float) -> None:
  """One rank: Horovod up, one collective done, then idle."""
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  hvd.init()
  hvd.allreduce(tf.constant(1.0))
  before = resource.getrusage(resource.RUSAGE_SELF)
  time.sleep(seconds)
  after = resource.getrusage(resource.RUSAGE_SELF)
  used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  print(f'rank {hvd.rank()}: {used:.2f} CPU s', flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--cycles', default='1,10',
                      help='HOROVOD_CYCLE_TIME values (ms), comma-separated')
  parser.add_argument('--seconds', type=float, default=10.0)
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.seconds)
    return
  print(hardware.machine_line())
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for cycle in args.cycles.split(','):
    forwarded = {'HOROVOD_CYCLE_TIME': cycle, 'TF_USE_LEGACY_KERAS': '1',
                 'TF_CPP_MIN_LOG_LEVEL': '3', 'PYTHONPATH': root}
    exports = [arg for name in forwarded for arg in ('-x', name)]
    result = subprocess.run(
        ['mpirun', '--allow-run-as-root', '-np', '2', '--bind-to', 'core']
        + exports + [sys.executable, '-m', 'benchmarks.horovod_idle',
                     '--worker', f'--seconds={args.seconds}'],
        cwd=root, env={**os.environ, **forwarded}, capture_output=True,
        text=True, check=True)
    # The ranks' lines can arrive interleaved: read the records, not lines.
    ranks = sorted(re.findall(r'rank \d+: [\d.]+ CPU s', result.stdout))
    print(f'HOROVOD_CYCLE_TIME={cycle} ms, {args.seconds:g} s idle: '
          + '; '.join(ranks))


if __name__ == '__main__':
  main()
