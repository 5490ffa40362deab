"""A 3x3 convolution's gradients: oneDNN's kernels against patches x matmul.

  python -m benchmarks.kernel_grad [--dtype bf16] [--batch 256]
  ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.kernel_grad --dtype fp32

For each stride, output map (2x2, 4x4, 7x7) and input channel count (the
output has stride x as many), the input and weight gradients of one 'same'
convolution, in one tf.function: natively (Conv2DBackpropInput and
Conv2DBackpropFilter), and as layers.MatmulConv2D computes them where
layers.kernel_grad_by_patches says so (the same input gradient, the weight
gradient as im2col patches x one matmul). Best of 3 rounds of 20 calls after
a warm-up. Prints a Markdown table with the rule's choice beside each row.
"""

import argparse
import time

from benchmarks import hardware

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-order

from resnet_keras.model import layers  # pylint: disable=g-import-not-at-top

_DTYPES = {'bf16': tf.bfloat16, 'fp32': tf.float32}


def _gradients(conv):
  @tf.function
  def gradients(x, k):
    with tf.GradientTape() as tape:
      tape.watch([x, k])
      y = conv(x, k)
    return tape.gradient(y, [x, k], output_gradients=tf.ones_like(y))
  return gradients


def _milliseconds(fn, *args, calls=20, rounds=3):
  for _ in range(3):
    fn(*args)
  best = float('inf')
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(calls):
      result = fn(*args)
    result[0].numpy()
    best = min(best, (time.perf_counter() - start) / calls * 1e3)
  return best


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--dtype', choices=sorted(_DTYPES), default='bf16')
  parser.add_argument('--batch', type=int, default=256)
  args = parser.parse_args()
  dtype = _DTYPES[args.dtype]
  print(f'{hardware.machine_line()}, {args.dtype}, batch {args.batch}\n')
  print('| stride | output | input channels | native ms | patches ms | '
        'native / patches | the rule picks |')
  print('|---|---|---|---|---|---|---|')
  for stride in (2, 1):
    for out in (2, 4, 7):
      for channels in (32, 64, 128, 256):
        size = out * stride
        x = tf.cast(tf.random.normal([args.batch, size, size, channels]),
                    dtype)
        k = tf.cast(tf.random.normal([3, 3, channels, channels * stride]),
                    dtype)
        native = _milliseconds(_gradients(
            lambda x, k, s=stride: tf.nn.conv2d(x, k, s, 'SAME')), x, k)
        patches = _milliseconds(_gradients(
            lambda x, k, s=stride: layers.conv_with_patch_matmul_kernel_grad(
                x, k, s)), x, k)
        picks = layers.kernel_grad_by_patches(out * out, channels, stride,
                                              dtype.name)
        print(f'| {stride} | {out}x{out} | {channels} | {native:.2f} | '
              f'{patches:.2f} | {native / patches:.2f}x | '
              f'{"patches" if picks else "native"} |', flush=True)


if __name__ == '__main__':
  main()
