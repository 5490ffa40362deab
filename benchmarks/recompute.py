"""Peak memory and img/s of a ResNet training step with and without
--enable_recompute.

Each setting runs in its own process (peak RSS is per process), alternating
off/on for --pairs pairs: these machines are shared, so only ratios from
alternating runs compare. A child builds the trainer's network
(network.build_network) and optimizer, then times training steps on one
synthetic batch. It reports RSS once the weights and optimizer slots exist,
the peak RSS after the steps (their difference is what the steps' tensors
added), and on a GPU tf.config.experimental.get_memory_info's peak.

  python -m benchmarks.recompute                      # ResNet-50, 128 px, bs 32
  python -m benchmarks.recompute --batch 64 --image_size 160 --dtype bf16
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mib() -> float:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise RuntimeError('no VmRSS')


def child(args) -> dict:
  """One setting's measurement, in this process."""
  from common import env  # pylint: disable=g-import-not-at-top
  env.prepare_tensorflow_environment()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  from resnet_keras.config import hardware  # pylint: disable=g-import-not-at-top
  from resnet_keras.model import network as network_lib  # pylint: disable=g-import-not-at-top
  from resnet_keras.optimization import optimizers  # pylint: disable=g-import-not-at-top
  from resnet_keras.config import RunConfig  # pylint: disable=g-import-not-at-top

  cfg = RunConfig(resnet_depth=args.resnet_depth, image_size=args.image_size,
                  dtype=args.dtype, enable_recompute=args.recompute,
                  batch_size=args.batch)
  machine = hardware.detect()
  tf_keras.mixed_precision.set_global_policy(
      {'fp32': 'float32', 'bf16': 'mixed_bfloat16'}[args.dtype])
  model = network_lib.build_network(cfg, 1000, use_regularizers=False,
                                    machine=machine)
  optimizer = optimizers.build_optimizer(cfg, 0.01)
  optimizers.create_slots(optimizer, model.trainable_variables)
  images = tf.random.uniform([args.batch, args.image_size, args.image_size, 3])
  labels = tf.random.uniform([args.batch], maxval=1000, dtype=tf.int32)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
          labels, model(images, training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  built_rss = rss_mib()
  for _ in range(args.warmup):
    step().numpy()
  started = time.perf_counter()
  for _ in range(args.steps):
    step().numpy()
  seconds = time.perf_counter() - started
  result = {'recompute': args.recompute,
            'img_per_s': args.batch * args.steps / seconds,
            'built_rss_mib': built_rss,
            # ru_maxrss is in KiB on Linux.
            'peak_rss_mib': resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024}
  if machine.has_gpu:
    result['gpu_peak_mib'] = tf.config.experimental.get_memory_info(
        'GPU:0')['peak'] / 2**20
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--resnet_depth', type=int, default=50)
  parser.add_argument('--image_size', type=int, default=128)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--dtype', default='fp32', choices=('fp32', 'bf16'))
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--pairs', type=int, default=1)
  parser.add_argument('--recompute', action='store_true',
                      help=argparse.SUPPRESS)  # A child's setting.
  parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args)))
    return
  passed = [a for a in sys.argv[1:] if a not in ('--recompute', '--child')]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  from resnet_keras.config import hardware  # pylint: disable=g-import-not-at-top
  print(f'CPU: {hardware.this_cpu().describe()}')
  print(f'ResNet-{args.resnet_depth} {args.dtype} batch {args.batch} at '
        f'{args.image_size} px, {args.steps} timed steps after '
        f'{args.warmup} warm-up')
  print(f'{"recompute":>9} {"img/s":>7} {"built RSS":>10} {"peak RSS":>9} '
        f'{"added":>7} {"GPU peak":>9}  (MiB)')
  for _ in range(args.pairs):
    for recompute in (False, True):
      command = [sys.executable, '-m', 'benchmarks.recompute', '--child'] + (
          passed + (['--recompute'] if recompute else []))
      out = subprocess.run(command, capture_output=True, text=True, env=env,
                           cwd=REPO_ROOT, check=False)
      if out.returncode:
        sys.exit(f'child failed:\n{out.stderr[-3000:]}')
      r = json.loads(out.stdout.strip().splitlines()[-1])
      gpu = f'{r["gpu_peak_mib"]:>9.0f}' if 'gpu_peak_mib' in r else (
          f'{"-":>9}')
      print(f'{"on" if recompute else "off":>9} {r["img_per_s"]:>7.1f} '
            f'{r["built_rss_mib"]:>10.0f} {r["peak_rss_mib"]:>9.0f} '
            f'{r["peak_rss_mib"] - r["built_rss_mib"]:>7.0f} {gpu}')


if __name__ == '__main__':
  main()
