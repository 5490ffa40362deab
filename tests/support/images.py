"""Images the tests feed the models and tools, and what the tools write
back: random pixels, image files of odd sizes, predict's printed top 5, the
plots' PNG files."""

import io
import os

import numpy as np
from PIL import Image

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
# The figures a run (and python -m resnet_keras.plots) draws, by file name.
FIGURES = ('loss', 'accuracy', 'learning_rate', 'examples_per_second')


def uniform_pixels(n=3, seed=0, image_size=32):
  """n float32 images of uniform random pixels in [0, 255)."""
  rng = np.random.RandomState(seed)
  return rng.uniform(0, 255, (n, image_size, image_size, 3)).astype(
      np.float32)


def encode(pixels, fmt):
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, format=fmt)
  return out.getvalue()


def write_images(folder):
  """A grayscale PNG and an RGB JPEG of odd sizes; returns their paths."""
  rng = np.random.RandomState(0)
  os.makedirs(folder, exist_ok=True)
  images = {'gray.png': encode(rng.randint(0, 256, (37, 91), np.uint8),
                               'PNG'),
            'wide.JPG': encode(rng.randint(0, 256, (123, 45, 3), np.uint8),
                               'JPEG')}
  paths = []
  for name, data in images.items():
    paths.append(os.path.join(folder, name))
    with open(paths[-1], 'wb') as f:
      f.write(data)
  return paths


def parse_predictions(stdout):
  """{path: [(probability, name), ...]} from predict's output."""
  results, current = {}, None
  for line in stdout.splitlines():
    if line.startswith('  '):
      probability, name = line.split(maxsplit=1)
      results[current].append((float(probability), name))
    else:
      current = line
      results[current] = []
  return results


def is_png(path):
  with open(path, 'rb') as f:
    return f.read(8) == PNG_MAGIC
