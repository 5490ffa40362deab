"""What a killed rank costs when the survivors keep their state in memory:
Horovod Elastic (Gloo) on the suite's three-host namespace cluster, the
lever issue 80 weighs against today's restart of every worker from the
last checkpoint (benchmarks/goodput_under_faults.py measures that one).

  python -m benchmarks.elastic_recovery [--minutes 4] [--every 60]
      [--cooldown 1]

`horovodrun --min-np 2 --max-np 3` runs one worker per host (h1 launches;
its workers reach the others over the cluster's ssh), each training the
soak's tiny ResNet (depth 10, width 0.25, 32 px, 4 images per worker,
synthetic) in loops of `--steps_per_loop` steps inside one tf.function,
the state committed to host memory after every loop
(hvd.elastic.TensorFlowKerasState). Every `--every` s the benchmark kills
(`kill -9`) the worker on h2 or h3 in turn. The survivors' next collective
fails, they restore the last commit, re-form the group without the dead
host (blacklisted for `--cooldown` s), and train on; once the host is
listed again the driver starts a new worker there, which joins at the
survivors' next commit. Rank 0 records each loop's end and each reset.

Prints, per kill: seconds from the kill to the survivors' next loop end
less one usual loop (the recovery), the steps redone, the seconds until
the job is back at three workers, and for the whole run the seconds of
training against the wall: the time the loops would take at the
uninterrupted speed over the wall from the first loop's end (the first
trace and start-up excluded, as each faulted attempt's would not be).
Root only (namespaces), with nothing else running.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import hardware
from testbed import cluster as cluster_lib

IMAGE_SIZE, NUM_CLASSES, WIDTH = 32, 10, 0.25


def worker(args) -> None:
  """One worker: trains under hvd.elastic.run; rank 0 appends its record."""
  from common import env  # pylint: disable=g-import-not-at-top
  env.prepare_tensorflow_environment()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  from resnet_keras.config import channels  # pylint: disable=g-import-not-at-top
  from resnet_keras.model import network  # pylint: disable=g-import-not-at-top

  process_start = time.time()
  hvd.init()
  model = network.resnet(
      10, NUM_CLASSES, IMAGE_SIZE,
      filters=[int(f * WIDTH) for f in channels.STAGE_FILTERS])
  optimizer = tf_keras.optimizers.legacy.SGD(0.01, momentum=0.9)
  optimizer._create_all_weights(model.trainable_variables)  # pylint: disable=protected-access
  images = tf.random.stateless_uniform(
      [args.batch_size, IMAGE_SIZE, IMAGE_SIZE, 3], seed=[1, 2])
  labels = tf.random.stateless_uniform([args.batch_size], seed=[3, 4],
                                       maxval=NUM_CLASSES, dtype=tf.int32)
  loss_fn = tf_keras.losses.SparseCategoricalCrossentropy()

  @tf.function
  def loop(steps):
    for _ in tf.range(steps):
      with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
      tape = hvd.DistributedGradientTape(tape)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))

  def record(event: str, step: int) -> None:
    if hvd.rank() == 0:
      with open(args.record, 'a') as f:
        f.write(json.dumps({'t': time.time(), 'event': event, 'step': step,
                            'size': hvd.size(), 'host': os.uname().nodename,
                            'process_start': process_start}) + '\n')

  state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0)
  state.register_reset_callbacks([lambda: record('reset', state.step)])
  steps = tf.constant(args.steps_per_loop)

  @hvd.elastic.run
  def train(state):
    record('start', state.step)
    while state.step < args.steps:
      loop(steps)
      state.step += args.steps_per_loop
      record('loop', state.step)
      state.commit()

  train(state)


def _bin_dir(work_dir: str, cluster) -> str:
  """A directory whose `ssh` is the cluster's (its own config file: nothing
  written to ~/.ssh), first on horovodrun's PATH."""
  path = os.path.join(work_dir, 'bin')
  os.makedirs(path)
  ssh = os.path.join(path, 'ssh')
  with open(ssh, 'w') as f:
    f.write(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {cluster.ssh_config} '
            '"$@"\n')
  os.chmod(ssh, 0o755)
  return path


def _horovodrun(args, cluster, work_dir: str, record: str) -> list:
  discovery = os.path.join(work_dir, 'discover.sh')
  with open(discovery, 'w') as f:
    f.write('#!/bin/sh\n' + ''.join(f'echo {h.address}:1\n'
                                    for h in cluster.hosts))
  os.chmod(discovery, 0o755)
  # The driver's INFO lines (each worker's state, each reset) and the
  # workers' stacks on a crash go to horovodrun.txt.
  return ['horovodrun', '--log-level', 'INFO', '--gloo', '-np', '3',
          '--min-np', '2', '--max-np', '3',
          '--host-discovery-script', discovery,
          '--blacklist-cooldown-range', str(args.cooldown),
          str(args.cooldown + 1), '--network-interface', 'eth0',
          '--ssh-port', str(cluster_lib.SSH_PORT),
          sys.executable, '-X', 'faulthandler',
          '-m', 'benchmarks.elastic_recovery', '--worker',
          f'--record={record}', f'--steps={args.steps}',
          f'--steps_per_loop={args.steps_per_loop}',
          f'--batch_size={args.batch_size}']


def _read(record: str) -> list:
  if not os.path.exists(record):
    return []
  with open(record) as f:
    return [json.loads(line) for line in f if line.strip()]


def report(events: list, kills: list) -> None:
  """Per kill and for the run, from rank 0's record and the kill times."""
  loops = [e for e in events if e['event'] == 'loop']
  if len(loops) < 3:
    print('too few loops recorded to measure')
    return
  gaps = [b['t'] - a['t'] for a, b in zip(loops, loops[1:])
          if b['step'] > a['step'] and a['size'] == b['size'] == 3]
  usual = statistics.median(gaps)
  per_step = usual / (loops[1]['step'] - loops[0]['step'])
  print(f'usual loop at 3 workers: {usual:.3f} s '
        f'({per_step * 1000:.1f} ms a step)')
  print(f'{"kill at s":>9} {"host":>5} {"recovery s":>10} {"redone":>6} '
        f'{"size 3 again s":>14}')
  t0 = loops[0]['t']
  for when, host in kills:
    before = [e for e in loops if e['t'] < when]
    after = [e for e in loops if e['t'] > when]
    if not before or not after:
      print(f'{when - t0:>9.0f} {host:>5} (no loop after it)')
      continue
    resumed = next((e for e in events
                    if e['t'] > when and e['event'] == 'start'), None)
    redone = before[-1]['step'] - resumed['step'] if resumed else 0
    # The group back at three workers: its first loop after a reset to 3.
    regrown = next((e for e in events if e['t'] > when and
                    e['event'] == 'reset' and e['size'] == 3), None)
    back = regrown and next((e for e in after if e['t'] > regrown['t']),
                            None)
    print(f'{when - t0:>9.0f} {host:>5} '
          f'{after[0]["t"] - when - usual:>10.1f} {redone:>6} '
          + (f'{back["t"] - when:>14.1f}' if back else f'{"never":>14}'))
  wall = loops[-1]['t'] - t0
  done = loops[-1]['step'] - loops[0]['step']
  print(f'{done} steps in {wall:.0f} s of wall after the first loop: '
        f'{done * per_step:.0f} s at the uninterrupted speed, '
        f'{done * per_step / wall:.2f} of the wall')


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--minutes', type=float, default=4,
                      help='about how long the job trains')
  parser.add_argument('--every', type=float, default=60,
                      help='seconds between kills')
  parser.add_argument('--cooldown', type=int, default=1,
                      help='seconds a failed host stays out (the lower end of '
                      'horovodrun --blacklist-cooldown-range)')
  parser.add_argument('--steps_per_loop', type=int, default=10)
  parser.add_argument('--batch_size', type=int, default=4,
                      help='per worker')
  parser.add_argument('--steps', type=int, default=0,
                      help='steps in all (0: from --minutes at 15 steps/s)')
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--record', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return 0
  why = cluster_lib.missing_requirements()
  if why:
    print(f'elastic_recovery: {why}', file=sys.stderr)
    return 2
  args.steps = args.steps or int(args.minutes * 60 * 15) // 10 * 10
  print(hardware.machine_line(), flush=True)
  work_dir = tempfile.mkdtemp(prefix='resnet_keras_elastic_')
  record = os.path.join(work_dir, 'record.jsonl')
  # Above the test suite's subnets (tests/multihost: 1-249), so that it
  # may run beside a suite; one no other cluster on this machine holds.
  taken = subprocess.run(['ip', 'netns', 'list'], capture_output=True,
                         text=True).stdout
  index = next((i for i in range(250, 255) if f'rk{i}sw' not in taken), None)
  if index is None:
    print('elastic_recovery: clusters rk250-rk254 are all in use',
          file=sys.stderr)
    return 2
  cluster = cluster_lib.Cluster(
      3, state_dir=f'/run/resnet_keras_elastic_{os.getpid()}',
      subnet_index=index, names_resolve=True).start()
  kills = []
  try:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ,
           'PATH': _bin_dir(work_dir, cluster) + ':' + os.environ['PATH'],
           'PYTHONPATH': root}
    with open(os.path.join(work_dir, 'horovodrun.txt'), 'w') as log:
      job = cluster.popen(cluster.hosts[0],
                          _horovodrun(args, cluster, work_dir, record), env,
                          stdout=log, stderr=subprocess.STDOUT, cwd=root)
      next_kill, victim = None, 1
      deadline = time.monotonic() + args.minutes * 60 * 4 + 120
      while job.poll() is None and time.monotonic() < deadline:
        if next_kill is None and any(e['event'] == 'loop'
                                     for e in _read(record)):
          next_kill = time.monotonic() + args.every
        if next_kill is not None and time.monotonic() >= next_kill:
          host = cluster.hosts[victim]
          pids = cluster.processes(host, '--worker')
          if pids:
            for pid in pids:
              os.kill(pid, signal.SIGKILL)
            kills.append((time.time(), host.name[-2:]))
            print(f'  kill -9 of the worker on {host.name} (pid {pids})',
                  flush=True)
          victim = 3 - victim
          next_kill += args.every
        time.sleep(0.2)
      if job.poll() is None:
        job.kill()
        print('horovodrun did not end in time: killed')
      print(f'horovodrun exit {job.wait()}')
  finally:
    cluster.stop()
  report(_read(record), kills)
  print(f'(work files: {work_dir})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
