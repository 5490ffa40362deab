"""Seconds a checkpoint stops training, written as the trainer wrote it
before (`manager.save`: the loop waits for the whole write) and as it does
now (checkpoints.Saver: the loop waits for the values' copy, and for the
write before where it is still going; the write runs beside training).

  python -m benchmarks.checkpoint_stall [--layouts one,horovod,mwm]
      [--depth 50 --image_size 64 --batch_size 8] [--steps 5 --saves 5]
      [--rounds 2] [--ema_decay 0]

Per layout (one process; 2 Horovod workers under mpirun; 2
multi_worker_mirrored workers on TF_CONFIG), on this host: the run's own
parts (assembly.py: model, optimizer, the weight average with
--ema_decay, checkpoint managers, trainer) train `--steps` steps between
saves, `--saves` saves each way, the ways alternating for `--rounds`
rounds (A B A B). The chief prints, per round and way: the loop's wait per
save (median and max: the first saves' of a process include setting up the
copies and tracing the copy), the write's own time, the wait at the end for
the last write, the checkpoint's size and the step time beside it; then
the final export's read of the weights, tf_keras's get_weights against
checkpoints.values (2 x --rounds times each, alternating).
--base_port (OpenMPI's ports from it + 100, as the launcher pins them)
keeps the Horovod job's mpirun off another job's ports; the
multi_worker_mirrored workers take free ones.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import hardware
from testbed.ports import free_ports

WAYS = ('sync', 'async')


def worker(args) -> None:
  """One process of a layout: trains and saves both ways, alternately."""
  from common import env  # pylint: disable=g-import-not-at-top
  env.prepare_tensorflow_environment()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from resnet_keras.engine import assembly  # pylint: disable=g-import-not-at-top
  from resnet_keras.training import goodput  # pylint: disable=g-import-not-at-top
  from resnet_keras.engine import start as start_lib  # pylint: disable=g-import-not-at-top
  from resnet_keras.config import RunConfig  # pylint: disable=g-import-not-at-top

  cfg = RunConfig(
      model_dir=args.model_dir, use_synthetic_data=True,
      resnet_depth=args.depth, image_size=args.image_size,
      batch_size=args.batch_size, num_classes=1000,
      train_steps=args.steps * (1 + args.saves * args.rounds * 2),
      steps_per_loop=args.steps, ema_decay=args.ema_decay, plots=False,
      enable_checkpoint_and_export=True, skip_eval=True,
      use_horovod=args.layout == 'horovod',
      distribution_strategy=('multi_worker_mirrored' if args.layout == 'mwm'
                             else 'off'))
  basis = assembly.set_up(cfg)
  backend, cfg = basis.backend, basis.effective_cfg
  plan = assembly.plan_for(basis)
  start = start_lib.decide(cfg, plan)
  parts = assembly.assemble_training(basis, plan, start)
  start_lib.restore(start, parts.weights(), cfg, basis.info, backend)
  attempt = goodput.Attempt(None, time.time(), 0)
  steps = tf.constant(args.steps, tf.int32)
  parts.trainer.train(steps)  # Tracing: not timed.

  def save(way: str, step: int) -> None:
    if not parts.saver.saves:  # A Horovod worker but the chief.
      return
    if way == 'async':
      parts.saver.save(step, attempt)
    else:  # What run.py did before.
      with backend.saving():
        parts.manager.save(checkpoint_number=step)

  for round_ in range(args.rounds):
    for way in WAYS:
      blocked, trained = [], []
      writes = attempt.record['checkpoint_writes']
      for _ in range(args.saves):
        began = time.monotonic()
        parts.trainer.train(steps)
        trained.append((time.monotonic() - began) / args.steps)
        step = int(parts.optimizer.iterations.numpy())
        began = time.monotonic()
        save(way, step)
        blocked.append(time.monotonic() - began)
      began = time.monotonic()
      parts.saver.wait(attempt)
      end_wait = time.monotonic() - began
      if backend.is_chief:
        size = sum(os.path.getsize(p) for p in glob.glob(
            os.path.join(args.model_dir, f'ckpt-{step}.*')))
        written = ((attempt.record['checkpoint_writes'] - writes) /
                   args.saves if way == 'async' else statistics.median(
                       blocked))
        print(f'{args.layout} round {round_ + 1} {way}: {args.saves} saves '
              f'of {size / 2**20:.0f} MiB, training blocked median '
              f'{statistics.median(blocked):.3f} s, max {max(blocked):.3f} s '
              f'(each: {", ".join(f"{b:.2f}" for b in blocked)}); write '
              f'{written:.2f} s on average; end wait {end_wait:.2f} s; step '
              f'{statistics.median(trained):.2f} s', flush=True)
  _time_weight_reads(parts.network, args.rounds, backend.is_chief)
  backend.leave()


def _time_weight_reads(network, rounds: int, is_chief: bool) -> None:
  """The final export's read of the weights, each way in turn (every
  worker joins it: under multi_worker_mirrored it is a collective): tf_keras's
  get_weights (TensorFlow's read, an all-reduce per replicas' mean) and
  checkpoints.values (those packed in one)."""
  from resnet_keras.rundir import checkpoints  # pylint: disable=g-import-not-at-top
  ways = {'get_weights': network.get_weights,
          'packed': lambda: checkpoints.values(network.weights)}
  seconds = {way: [] for way in ways}
  for _ in range(rounds * 2):
    for way, read in ways.items():
      began = time.monotonic()
      read()
      seconds[way].append(time.monotonic() - began)
  if is_chief:
    print('the export\'s read of the weights: ' + '; '.join(
        f'{way} median {statistics.median(s):.3f} s (each: '
        f'{", ".join(f"{x:.2f}" for x in s)})' for way, s in seconds.items()),
          flush=True)


def _worker_argv(args, layout: str, model_dir: str):
  return [sys.executable, '-m', 'benchmarks.checkpoint_stall', '--worker',
          f'--layout={layout}', f'--model_dir={model_dir}',
          f'--depth={args.depth}', f'--image_size={args.image_size}',
          f'--batch_size={args.batch_size}', f'--steps={args.steps}',
          f'--saves={args.saves}', f'--rounds={args.rounds}',
          f'--ema_decay={args.ema_decay}']


def run_layout(args, layout: str, work_dir: str) -> int:
  """Starts `layout`'s processes; their exit code (the worst)."""
  model_dir = os.path.join(work_dir, layout)
  argv = _worker_argv(args, layout, model_dir)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if layout == 'one':
    return subprocess.call(argv, cwd=root)
  if layout == 'horovod':
    from resnet_keras.launcher import port_guard  # pylint: disable=g-import-not-at-top
    ports = port_guard.mpi_env(port_guard.mpi_range(args.base_port))
    superuser = ['--allow-run-as-root'] if os.geteuid() == 0 else []
    return subprocess.call(
        ['mpirun'] + superuser + ['-np', '2', '--oversubscribe',
                                  '--bind-to', 'none'] + argv,
        cwd=root, env={**os.environ, **ports})
  addresses = [f'127.0.0.1:{port}' for port in free_ports(2)]
  processes = [subprocess.Popen(argv, cwd=root, env={
      **os.environ, 'TF_CONFIG': json.dumps({
          'cluster': {'worker': addresses},
          'task': {'type': 'worker', 'index': index}})})
               for index in range(2)]
  return max(p.wait() for p in processes)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--layouts', default='one,horovod,mwm')
  parser.add_argument('--depth', type=int, default=50)
  parser.add_argument('--image_size', type=int, default=64)
  parser.add_argument('--batch_size', type=int, default=8,
                      help='per worker under Horovod, global otherwise')
  parser.add_argument('--steps', type=int, default=5,
                      help='training steps between two saves')
  parser.add_argument('--saves', type=int, default=5,
                      help='saves each way per round')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--ema_decay', type=float, default=0.0)
  parser.add_argument('--base_port', type=int, default=31000)
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--layout', help=argparse.SUPPRESS)
  parser.add_argument('--model_dir', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return
  print(hardware.machine_line(), flush=True)
  work_dir = tempfile.mkdtemp(prefix='checkpoint_stall_')
  codes = [run_layout(args, layout, work_dir)
           for layout in args.layouts.split(',')]
  sys.exit(max(codes))


if __name__ == '__main__':
  main()
