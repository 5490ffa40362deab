"""preprocess_imagenet.py's inputs and outputs, for its tests: a tiny raw
tree of JPEGs and PNGs built with Pillow, the script run as users run it or
its conversion (data/imagenet_converter.py) called in this process, and its
records read back."""

import io
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from resnet_keras.data import imagenet_converter
from tests.support.runner import REPO_ROOT

SYNSETS = ['n01440764', 'n01443537', 'n01484850']
TRAIN_PER_CLASS = 7
NUM_VALIDATION = 6


def pil_image(width, height, seed, mode='RGB'):
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  return Image.fromarray(pixels).convert(mode)


def encoded(image, fmt):
  out = io.BytesIO()
  image.save(out, format=fmt)
  return out.getvalue()


def write_bytes(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)


def _class_images(folder, class_index):
  """Writes TRAIN_PER_CLASS images; each class holds one odd one."""
  for i in range(TRAIN_PER_CLASS):
    seed = class_index * 100 + i
    size = (24 + i, 16 + class_index)
    name = f'{SYNSETS[class_index]}_{i}.JPEG'
    if i == 0 and class_index == 0:  # a PNG disguised by its name
      data = encoded(pil_image(*size, seed), 'PNG')
    elif i == 0 and class_index == 1:
      data = encoded(pil_image(*size, seed, 'CMYK'), 'JPEG')
    elif i == 0 and class_index == 2:
      data = encoded(pil_image(*size, seed, 'L'), 'JPEG')
    elif i == 1:  # other accepted extensions
      name = f'{SYNSETS[class_index]}_{i}' + ['.jpg', '.PNG', '.jpeg'][
          class_index]
      data = encoded(pil_image(*size, seed),
                     'PNG' if name.endswith('.PNG') else 'JPEG')
    else:
      data = encoded(pil_image(*size, seed), 'JPEG')
    write_bytes(os.path.join(folder, name), data)


def make_raw(root, validation_layout='labels_file'):
  """A raw tree with 3 classes; returns its path."""
  raw = os.path.join(root, 'raw')
  for c, synset in enumerate(SYNSETS):
    _class_images(os.path.join(raw, 'train', synset), c)
  # Neither of these is an image to convert.
  write_bytes(os.path.join(raw, 'train', SYNSETS[0], 'README.txt'), b'notes')
  write_bytes(os.path.join(raw, 'train', SYNSETS[0], '._x.JPEG'), b'\0\5\26\7')
  val_synsets = [SYNSETS[i % len(SYNSETS)] for i in range(NUM_VALIDATION)]
  for i, synset in enumerate(val_synsets):
    name = f'ILSVRC2012_val_{i + 1:08d}.JPEG'
    data = encoded(pil_image(20, 20, 1000 + i), 'JPEG')
    if validation_layout == 'labels_file':
      write_bytes(os.path.join(raw, 'validation', name), data)
    else:
      write_bytes(os.path.join(raw, 'validation', synset, name), data)
  if validation_layout == 'labels_file':
    with open(os.path.join(raw, 'synset_labels.txt'), 'w') as f:
      f.write(''.join(s + '\n' for s in val_synsets))
  return raw


def run_script(*args):
  return subprocess.run(
      [sys.executable, 'preprocess_imagenet.py', *args], cwd=REPO_ROOT,
      capture_output=True, text=True, check=False, timeout=120)


def convert_in_process(raw, out, train_shards=4, validation_shards=2,
                       skip_bad_images=False):
  return imagenet_converter.convert(
      raw, out, {'train': train_shards, 'validation': validation_shards},
      num_workers=1, skip_bad_images=skip_bad_images)


def read_split(out, split):
  """(shard name, parsed example) of every record, in file order."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  records = []
  split_dir = os.path.join(out, split)
  for name in sorted(os.listdir(split_dir)):
    for record in tf.data.TFRecordDataset(os.path.join(split_dir, name)):
      records.append((name, tf.train.Example.FromString(record.numpy())))
  return records


def feature(example, key):
  f = example.features.feature[key]
  return list(f.int64_list.value) or list(f.bytes_list.value)


def assert_one_line_error(result, *fragments):
  """The script's usage error: exit code 2, one 'error:' line."""
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('error: ')
  assert 'Traceback' not in result.stderr
  for fragment in fragments:
    assert fragment in lines[0]


def reference_layout(raw):
  """Renames the split folders as the reference's extraction steps name them."""
  os.rename(os.path.join(raw, 'train'), os.path.join(raw, 'img_train'))
  os.rename(os.path.join(raw, 'validation'), os.path.join(raw, 'img_val'))
