"""Milliseconds per call of the workers' vote after each training loop
(`Backend.any_worker`: a non-finite weight or a stop signal on any worker?)
under multi_worker_mirrored, traced as it is now and run eagerly as it was.

  python -m benchmarks.worker_vote [--calls 100] [--rounds 3]

Starts 2 workers on this host (TF_CONFIG on free local ports); each round
times `--calls` votes each way, alternately, and the chief prints the
milliseconds per call. Run eagerly, strategy.run under
MultiWorkerMirroredStrategy sets its replicas up on every call, and
TensorFlow logs a warning that it "has significant overhead".
"""

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import hardware
from testbed.ports import free_ports


def worker(index: int, calls: int, rounds: int) -> None:
  """One worker: the vote timed both ways, alternately."""
  from common import env  # pylint: disable=g-import-not-at-top
  env.prepare_tensorflow_environment()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from resnet_keras.engine import distribution  # pylint: disable=g-import-not-at-top
  backend = distribution.Backend(
      strategy=tf.distribute.MultiWorkerMirroredStrategy(),
      worker_index=index, num_workers=2)
  flags = (False, index == 1)  # Worker 1 votes yes on the second question.

  def traced():
    return backend.any_worker(*flags)

  def eager():
    counts = backend.count_workers(tf.constant(flags), 'any_worker').numpy()
    return tuple(bool(count > 0) for count in counts)

  for vote in (traced, eager):  # Traced once, set up once: not timed.
    assert vote() == (False, True)
  for round_ in range(rounds):
    for name, vote in (('traced', traced), ('eager', eager)):
      started = time.perf_counter()
      for _ in range(calls):
        vote()
      per_call = (time.perf_counter() - started) / calls * 1e3
      if index == 0:
        print(f'round {round_ + 1}: {name} {per_call:.2f} ms per call',
              flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--calls', type=int, default=100)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--worker', type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(args.worker, args.calls, args.rounds)
    return
  print(hardware.machine_line())
  addresses = [f'127.0.0.1:{port}' for port in free_ports(2)]
  processes = []
  for index in range(2):
    tf_config = {'cluster': {'worker': addresses},
                 'task': {'type': 'worker', 'index': index}}
    processes.append(subprocess.Popen(
        [sys.executable, '-m', 'benchmarks.worker_vote', '--worker',
         str(index), '--calls', str(args.calls), '--rounds',
         str(args.rounds)],
        env={**os.environ, 'TF_CONFIG': json.dumps(tf_config)}))
  sys.exit(max(p.wait() for p in processes))


if __name__ == '__main__':
  main()
