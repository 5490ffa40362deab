"""Training img/s of ResNet-10 shapes (--stage_widths) on 28x28 images.

  python -m benchmarks.shapes --dtype fp32 [--batch 256] [--conv_impl matmul]
  ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.shapes --dtype fp32

One training step (forward, backward, SGD with momentum) of each shape at
the quick start's batch, small stem, in a loop of 20 steps inside one
tf.function, best of 3 loops after a warm-up: the model alone, without the
input pipeline, so it says how the channel counts fare in the kernels of a
dtype and ISA. The quarter-width ResNet-18 (the time-to-accuracy baseline's
model) comes first, as the reference.
"""

import argparse
import time

from benchmarks import hardware

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-order
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-order

from resnet_keras.model import network as network_lib  # pylint: disable=g-import-not-at-top

# Name -> (depth, stage widths).
SHAPES = {
    'resnet18 16-32-64-128 (baseline)': (18, (16, 32, 64, 128)),
    'resnet10 32-64-128-256 (x0.5)': (10, (32, 64, 128, 256)),
    'resnet10 32-64-128-128': (10, (32, 64, 128, 128)),
    'resnet10 32-48-96-192': (10, (32, 48, 96, 192)),
    'resnet10 24-48-96-256': (10, (24, 48, 96, 256)),
    'resnet10 24-48-96-192 (x0.375)': (10, (24, 48, 96, 192)),
    'resnet10 24-48-96-128': (10, (24, 48, 96, 128)),
}
POLICIES = {'fp32': 'float32', 'bf16': 'mixed_bfloat16'}


def images_per_second(depth, widths, batch: int, matmul: bool) -> float:
  network = network_lib.resnet(depth, 10, 28, stem='small',
                               matmul_convs=matmul, filters=widths)
  optimizer = tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
  images = tf.random.uniform((batch, 28, 28, 3))
  labels = tf.one_hot(tf.random.uniform((batch,), 0, 10, tf.int32), 10)

  @tf.function
  def train(steps):
    for _ in tf.range(steps):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf_keras.losses.categorical_crossentropy(
            labels, network(images, training=True)))
      gradients = tape.gradient(loss, network.trainable_variables)
      optimizer.apply_gradients(zip(gradients, network.trainable_variables))
    return loss

  train(tf.constant(3))
  best = 0.0
  for _ in range(3):
    start = time.perf_counter()
    train(tf.constant(20)).numpy()
    best = max(best, 20 * batch / (time.perf_counter() - start))
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dtype', choices=sorted(POLICIES), default='fp32')
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--conv_impl', choices=('native', 'matmul'),
                      default='matmul')
  args = parser.parse_args()
  print(hardware.machine_line())
  tf_keras.mixed_precision.set_global_policy(POLICIES[args.dtype])
  print(f'| shape | img/s, {args.dtype}, batch {args.batch}, '
        f'{args.conv_impl} convolutions | vs the baseline |')
  print('|---|---|---|')
  reference = None
  for name, (depth, widths) in SHAPES.items():
    speed = images_per_second(depth, widths, args.batch,
                              args.conv_impl == 'matmul')
    reference = reference or speed
    print(f'| {name} | {speed:,.0f} | {speed / reference:.2f} |', flush=True)


if __name__ == '__main__':
  main()
