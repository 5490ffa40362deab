"""Throughput of preprocess_imagenet.py's conversion
(resnet_keras/data/imagenet_converter.py) with 1 and with 2 worker
processes.

Generates 256x256 RGB JPEGs in a temporary raw tree, converts it with
--num_workers 1 and 2 (best of --repeats each) and prints images/sec and
the speed-up, with the CPU time of the parent and of the workers (the
per-image work belongs in the workers).

  python -m benchmarks.converter_workers [--images_per_class 150]
"""

import contextlib
import io
import os
import resource
import sys
import tempfile
import time

from absl import app, flags
import numpy as np
from PIL import Image

from common import env
from resnet_keras.data import imagenet_converter

FLAGS = flags.FLAGS
flags.DEFINE_integer('num_classes', 4, 'Classes in the generated tree.')
flags.DEFINE_integer('images_per_class', 150,
                     'Training images per class; validation gets a sixth.')
flags.DEFINE_integer('repeats', 5, 'Conversions per worker count; the best '
                     'one counts.')

IMAGE_SIZE = 256


def photo_like_jpeg(path, rng):
  """Smooth colour areas plus grain: JPEG sizes close to real photos'."""
  coarse = rng.integers(0, 256, (IMAGE_SIZE // 16, IMAGE_SIZE // 16, 3),
                        dtype=np.uint8)
  smooth = np.asarray(Image.fromarray(coarse).resize(
      (IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR), dtype=np.int16)
  grain = rng.integers(-12, 13, smooth.shape, dtype=np.int16)
  pixels = np.clip(smooth + grain, 0, 255).astype(np.uint8)
  Image.fromarray(pixels).save(path, quality=90)


def make_raw_tree(root, num_classes, images_per_class):
  rng = np.random.default_rng(0)
  for split, count in [('train', images_per_class),
                       ('validation', max(1, images_per_class // 6))]:
    for c in range(num_classes):
      folder = os.path.join(root, split, f'n{c:08d}')
      os.makedirs(folder)
      for i in range(count):
        photo_like_jpeg(os.path.join(folder, f'{c}_{i}.JPEG'), rng)


def cpu_seconds(who):
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def timed_conversion(raw, out, num_workers):
  """(images/sec, CPU seconds in the parent, CPU seconds in the workers)."""
  before = [cpu_seconds(resource.RUSAGE_SELF),
            cpu_seconds(resource.RUSAGE_CHILDREN)]
  start = time.monotonic()
  with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
    metadata = imagenet_converter.convert(
        raw, out, {'train': 16, 'validation': 4}, num_workers,
        skip_bad_images=False)
  seconds = time.monotonic() - start
  return (sum(metadata['num_examples'].values()) / seconds,
          cpu_seconds(resource.RUSAGE_SELF) - before[0],
          cpu_seconds(resource.RUSAGE_CHILDREN) - before[1])


def main(argv):
  del argv
  # Imported up front so that neither timing includes TensorFlow's import.
  import tensorflow  # pylint: disable=import-outside-toplevel,unused-import
  with tempfile.TemporaryDirectory() as tmp:
    raw = os.path.join(tmp, 'raw')
    make_raw_tree(raw, FLAGS.num_classes, FLAGS.images_per_class)
    best = {}
    for workers in (1, 2):
      runs = [timed_conversion(raw, os.path.join(tmp, f'out{workers}_{r}'),
                               workers) for r in range(FLAGS.repeats)]
      best[workers] = max(runs)
  num_images = FLAGS.num_classes * (FLAGS.images_per_class +
                                    max(1, FLAGS.images_per_class // 6))
  from resnet_keras.config import hardware  # pylint: disable=import-outside-toplevel
  print(f'CPU: {hardware.this_cpu().describe()}')
  print(f'{num_images} JPEGs of {IMAGE_SIZE}x{IMAGE_SIZE}, '
        f'{os.cpu_count()} CPUs, best of {FLAGS.repeats}')
  for workers, (rate, parent_cpu, workers_cpu) in best.items():
    print(f'--num_workers {workers}: {rate:.0f} images/sec '
          f'(CPU: parent {parent_cpu:.2f}s, workers {workers_cpu:.2f}s)')
  print(f'speed-up with 2 workers: {best[2][0] / best[1][0]:.2f}x')


if __name__ == '__main__':
  env.prepare_tensorflow_environment()  # Before the workers start.
  # As in preprocess_imagenet.py: app.run would make the TensorFlow import
  # scan for GPUs in the parent, which the converter's own runs never do.
  app.define_help_flags()
  main(app.parse_flags_with_usage(sys.argv))
