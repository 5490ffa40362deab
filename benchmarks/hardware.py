"""This machine's limits, measured: matmul peak, memory bandwidth, and
ResNet-50's FLOP count.

Model FLOP utilisation (MFU) = achieved training FLOP/s / matmul peak. The
peak is what TensorFlow's own matmul reaches on this machine (not a vendor
sheet), measured in the same run as the training it is compared with.

As a script it prints them alone: the machine, the fp32 and bf16 matmul
peaks and the memory bandwidth (compare_upstream.py and roofline.py measure
them beside their own numbers).

  python -m benchmarks.hardware [--matmul_size 2048] [--bandwidth_elements N]
"""

import argparse
import os
import time


from common import env  # pylint: disable=g-import-not-at-top

# As in every entry point: oneDNN on, before TensorFlow loads. What that set
# is kept, so that a benchmark can start a program in the user's own env.
_BEFORE = dict(os.environ)
env.prepare_tensorflow_environment()
SET_BY_US = {k: v for k, v in os.environ.items() if _BEFORE.get(k) != v}

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from resnet_keras.config import hardware as machine_lib  # pylint: disable=g-import-not-at-top


def machine_line() -> str:
  """The CPU and oneDNN state every benchmark prints with its numbers."""
  status = env.onednn_status()
  return (f'machine: {machine_lib.detect().describe()}; oneDNN '
          f'{"on" if status["onednn"] else "off"} '
          f'({status["onednn_reason"]})')

# Multiply-accumulates of one ResNet-50 v1.5 forward pass at 224x224: 4.1 G
# (8.2 GFLOP). Training costs about 3x the forward pass (forward, gradients
# with respect to activations, gradients with respect to weights).
RESNET50_TRAIN_GFLOP_PER_IMAGE_224 = 3 * 2 * 4.1


def resnet50_train_gflop_per_image(image_size: int = 224) -> float:
  return RESNET50_TRAIN_GFLOP_PER_IMAGE_224 * (image_size / 224) ** 2


# What is measured unless a script is told otherwise (add_size_arguments).
MATMUL_SIZE = 2048
BANDWIDTH_ELEMENTS = 1 << 28  # 1 GiB of fp32: far beyond any cache.


def matmul_peak_gflops(dtype: str, size: int = MATMUL_SIZE,
                       repeats: int = 20) -> float:
  """GFLOP/s of a size^3 matmul in `dtype` ('fp32' or 'bf16')."""
  tf_dtype = {'fp32': tf.float32, 'bf16': tf.bfloat16}[dtype]
  a = tf.cast(tf.random.normal([size, size]), tf_dtype)
  matmul = tf.function(lambda: tf.matmul(a, a))
  matmul().numpy()  # Trace and warm up.
  best = float('inf')
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(repeats):
      out = matmul()
    out.numpy()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 * repeats / best / 1e9


def memory_bandwidth_gbs(elements: int = BANDWIDTH_ELEMENTS, repeats: int = 5):
  """Best GB/s of TensorFlow's fp32 adds on 1 GiB tensors (by default), by
  kind.

  'add' writes a fresh tensor, as most ops of a step do (each write first
  reads the line it fills); 'in-place add' (a variable's assign_add) writes
  memory it just read. roofline.py's ceilings use the higher of the two.
  """
  a = tf.random.uniform([elements])
  b = tf.random.uniform([elements])
  total = tf.Variable(tf.zeros([elements]))

  def add_in_place():
    total.assign_add(a, read_value=False)

  rates = {}
  for name, op in (('add', tf.function(lambda: a + b)),
                   ('in-place add', tf.function(add_in_place))):
    op()  # Trace; CPU ops return only once they are done.
    seconds = []
    for _ in range(repeats):
      start = time.perf_counter()
      op()
      seconds.append(time.perf_counter() - start)
    rates[name] = 3 * elements * 4 / min(seconds) / 1e9
  return rates


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
  """--matmul_size and --bandwidth_elements, for the scripts that measure
  the limits: smaller ones make a check of seconds (the tests), not a
  measurement."""
  parser.add_argument('--matmul_size', type=int, default=MATMUL_SIZE,
                      help='Rows (= columns) of the square matmul.')
  parser.add_argument('--bandwidth_elements', type=int,
                      default=BANDWIDTH_ELEMENTS,
                      help='fp32 elements of each tensor added; below the '
                      "caches' size this measures them, not memory.")


def main():
  # The first paragraph: the docstring's first line ends mid-sentence.
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  add_size_arguments(parser)
  args = parser.parse_args()
  print(machine_line())
  print(f'matmul peak, {args.matmul_size}^3: ' + ', '.join(
      f'{dtype} {matmul_peak_gflops(dtype, args.matmul_size):.0f} GFLOP/s'
      for dtype in ('fp32', 'bf16')))
  rates = memory_bandwidth_gbs(args.bandwidth_elements)
  mib = args.bandwidth_elements * 4 / 2**20
  print(f'memory bandwidth, fp32 adds on {mib:.4g} MiB tensors: ' + ', '.join(
      f'{name} {rate:.1f} GB/s' for name, rate in rates.items()))


if __name__ == '__main__':
  main()
