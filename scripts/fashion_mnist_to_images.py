"""Writes Fashion-MNIST as a raw image tree that preprocess_imagenet.py reads,
from the IDX files of Debian's dataset-fashion-mnist: OUT/train/<class>/*.png
and OUT/validation/<class>/*.png (resnet_keras/data/fashion_mnist.py says
what and how).

Usage (from the repository's root):
  python -m scripts.fashion_mnist_to_images \\
      --idx_dir /usr/share/datasets/fashion-mnist --out_dir RAW \\
      [--limit_per_class N] [--num_workers N]
"""

import os
import time

from absl import flags

from common import cli
from common.errors import UsageError
from resnet_keras.data import fashion_mnist

FLAGS = flags.FLAGS


def define_flags(values: flags.FlagValues) -> None:
  """Defined on demand, so that importing this module defines no flags."""
  flags.DEFINE_string('idx_dir', '/usr/share/datasets/fashion-mnist',
                      'Directory with the Fashion-MNIST *-idx?-ubyte.gz files.',
                      flag_values=values)
  flags.DEFINE_string('out_dir', 'data/fashion_mnist/raw',
                      'Output directory for train/ and validation/.',
                      flag_values=values)
  flags.DEFINE_integer('limit_per_class', 0,
                       'Keep only the first N images of each class in each '
                       'split (0: keep all).',
                       flag_values=values)
  flags.DEFINE_integer('num_workers', os.cpu_count() or 1,
                       'Processes that encode and write the PNG files.',
                       flag_values=values)


def main(argv):
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {" ".join(argv[1:])}; all '
                     'options are --flags')
  start = time.monotonic()
  written = fashion_mnist.convert(FLAGS.idx_dir, FLAGS.out_dir, FLAGS.limit_per_class,
                    FLAGS.num_workers)
  seconds = time.monotonic() - start
  if written:
    print(f'wrote {written} images to {FLAGS.out_dir} in {seconds:.1f}s '
          f'({written / seconds:.0f} images/sec)')
  else:
    print(f'{FLAGS.out_dir} already holds the expected images; nothing to do')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
