"""What a run pays before its first step: importing the trainer, and
building the training augmentation.

  python -m benchmarks.startup [--runs 5] [--randaugment SPEC]

1. Importing `resnet_keras.training.run` (the trainer, and TensorFlow,
   tf_keras and orbit under it) in a fresh Python, as every worker of a job does at
   each start and restart: median wall and CPU seconds of --runs processes.
2. The training augmentation (RandAugment per --randaugment, then random
   erasing) as a tf.data map over 28x28 images, the way the input pipeline
   applies it, which rebuilds it at every progressive-resizing size:
   seconds to build the map (tracing), then to its first element (the
   function's graph optimised and instantiated): the process's first
   build (official's augment module imported, anything AutoGraph converts
   converted), then the median of --runs more; then images/s through it on
   one thread.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks import hardware

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-order

from resnet_keras.data import augment  # pylint: disable=g-import-not-at-top
from resnet_keras.data.preprocessing import augmentation_seed  # pylint: disable=g-import-not-at-top
from resnet_keras.config.randaugment_spec import parse_randaugment  # pylint: disable=g-import-not-at-top

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORT_TRAINER = ('from common import env; '
                  'env.prepare_tensorflow_environment(); '
                  'from resnet_keras.training import run')
IMAGES = 64


def import_seconds(runs: int):
  """(median wall, median CPU) seconds of a fresh process importing the
  trainer."""
  walls, cpus = [], []
  for _ in range(runs):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, '-c', IMPORT_TRAINER], check=True,
                   cwd=REPO_ROOT, capture_output=True)
    walls.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime - before.ru_utime +
                after.ru_stime - before.ru_stime)
  return statistics.median(walls), statistics.median(cpus)


def augmented(augmentation: augment.ImageAugmentation, size: int):
  """The augmentation over IMAGES fixed random images, on one thread."""
  images = tf.random.stateless_uniform([IMAGES, size, size, 3], [0, 1], 0,
                                       255)
  records = tf.data.Dataset.from_tensor_slices(images).enumerate()
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  return records.map(lambda position, image: augmentation(
      image, augmentation_seed(0, position))).with_options(options)


def build_seconds(augmentation: augment.ImageAugmentation, size: int):
  """(seconds to build the map, seconds to its first element)."""
  start = time.perf_counter()
  dataset = augmented(augmentation, size)
  built = time.perf_counter()
  next(iter(dataset))
  return built - start, time.perf_counter() - built


def images_per_second(augmentation: augment.ImageAugmentation, size: int,
                      passes: int = 5) -> float:
  dataset = augmented(augmentation, size)
  for _ in dataset:  # Warm-up pass.
    pass
  start = time.perf_counter()
  for _ in range(passes):
    for _ in dataset:
      pass
  return passes * IMAGES / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', type=int, default=5)
  parser.add_argument('--randaugment', default='rand-m9-n2-mstd0.5-inc1')
  parser.add_argument('--image_size', type=int, default=28)
  args = parser.parse_args()
  print(hardware.machine_line())
  wall, cpu = import_seconds(args.runs)
  print(f'import resnet_keras.training.run in a fresh process: '
        f'{wall:.2f} s wall, {cpu:.2f} s CPU (median of {args.runs})')
  augmentation = augment.ImageAugmentation(
      randaugment=parse_randaugment(args.randaugment), erasing_prob=0.25)
  first = build_seconds(augmentation, args.image_size)
  builds = [build_seconds(augmentation, args.image_size)
            for _ in range(args.runs)]
  print(f'--randaugment={args.randaugment} --random_erasing=0.25 at '
        f'{args.image_size} px: first map built in {first[0]:.2f} s (what '
        'each process pays once), later ones in '
        f'{statistics.median(b[0] for b in builds):.2f} s, first element '
        f'{statistics.median(b[1] for b in builds):.2f} s later (median of '
        f'{args.runs}); '
        f'{images_per_second(augmentation, args.image_size):,.0f} images/s '
        'on one thread')


if __name__ == '__main__':
  main()
