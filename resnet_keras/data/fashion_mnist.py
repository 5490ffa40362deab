"""Fashion-MNIST as a raw image tree that preprocess_imagenet.py reads.

Reads the IDX files that Debian's dataset-fashion-mnist package installs
(`apt-get install dataset-fashion-mnist`) and writes

  OUT/train/<class>/train_00000.png        the 60,000 training images
  OUT/validation/<class>/t10k_00000.png    the 10,000 test images

as 28x28 RGB PNGs (the gray value in all three channels). The class folders
(00_tshirt_top ... 09_ankle_boot) sort in the original label order, so
preprocess_imagenet.py gives original label k the label k + 1.

The tree is built under a hidden temporary name and renamed when complete; a
rerun whose output already holds the expected images does nothing.

The command line is scripts/fashion_mnist_to_images.py.
"""

import gzip
import multiprocessing
import os
import shutil

import numpy as np
from PIL import Image

from common.errors import UsageError

CLASS_NAMES = ('00_tshirt_top', '01_trouser', '02_pullover', '03_dress',
               '04_coat', '05_sandal', '06_shirt', '07_sneaker', '08_bag',
               '09_ankle_boot')
# split -> (IDX file prefix, which is also the prefix of the PNG names).
SPLITS = {'train': 'train', 'validation': 't10k'}
IMAGE_SIZE = 28
CHUNK_SIZE = 1000

# The third byte of an IDX magic number encodes the element type.
_IDX_DTYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4',
               0x0D: '>f4', 0x0E: '>f8'}


def parse_idx(data, name):
  """The array held by IDX-format bytes; `name` is used in errors."""
  if len(data) < 4 or data[:2] != b'\0\0' or data[2] not in _IDX_DTYPES:
    raise UsageError(f'{name} is not an IDX file (bad magic number); '
                     'reinstall dataset-fashion-mnist')
  ndim = data[3]
  header = 4 + 4 * ndim
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                for i in range(ndim))
  dtype = np.dtype(_IDX_DTYPES[data[2]])
  if len(data) != header + dtype.itemsize * int(np.prod(shape)):
    raise UsageError(f'{name} holds {len(data)} bytes, which does not fit '
                     f'its header (shape {shape}); reinstall '
                     'dataset-fashion-mnist')
  return np.frombuffer(data, dtype, offset=header).reshape(shape)


def idx_path(idx_dir, prefix, kind):
  suffix = {'images': 'images-idx3', 'labels': 'labels-idx1'}[kind]
  return os.path.join(idx_dir, f'{prefix}-{suffix}-ubyte.gz')


def read_idx(path):
  if not os.path.isfile(path):
    raise UsageError(f'{path} not found; install Fashion-MNIST with '
                     '`apt-get install dataset-fashion-mnist` or point '
                     '--idx_dir at the directory with its IDX files')
  try:
    with gzip.open(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise UsageError(f'cannot read {path} ({e}); reinstall '
                     'dataset-fashion-mnist') from None
  return parse_idx(data, path)


def read_labels(idx_dir, prefix):
  path = idx_path(idx_dir, prefix, 'labels')
  labels = read_idx(path)
  if (labels.ndim != 1 or not labels.size
      or labels.max() >= len(CLASS_NAMES)):
    raise UsageError(f'{path} does not hold labels 0..9; reinstall '
                     'dataset-fashion-mnist')
  return labels


def read_images(idx_dir, prefix, num_labels):
  path = idx_path(idx_dir, prefix, 'images')
  images = read_idx(path)
  if images.shape != (num_labels, IMAGE_SIZE, IMAGE_SIZE):
    raise UsageError(f'{path} has shape {images.shape}, expected '
                     f'({num_labels}, {IMAGE_SIZE}, {IMAGE_SIZE}); reinstall '
                     'dataset-fashion-mnist')
  return images


def select(labels, limit_per_class):
  """Indices of the images to keep, in file order: the first N per class."""
  if not limit_per_class:
    return np.arange(len(labels))
  keep = [np.flatnonzero(labels == c)[:limit_per_class]
          for c in range(len(CLASS_NAMES))]
  return np.sort(np.concatenate(keep))


def class_counts(labels):
  counts = np.bincount(labels, minlength=len(CLASS_NAMES))
  return {name: int(n) for name, n in zip(CLASS_NAMES, counts) if n}


def tree_counts(out_dir):
  """{split: {class folder: number of .png files}} of an existing tree."""
  counts = {}
  for split in SPLITS:
    split_dir = os.path.join(out_dir, split)
    if os.path.isdir(split_dir):
      with os.scandir(split_dir) as entries:
        folders = [e.path for e in entries if e.is_dir()]
      counts[split] = {
          os.path.basename(folder): sum(f.endswith('.png')
                                        for f in os.listdir(folder))
          for folder in folders}
  return counts


def write_pngs(chunk):
  """Writes (path, 28x28 uint8 array) pairs as RGB PNGs."""
  for path, pixels in chunk:
    Image.fromarray(pixels, 'L').convert('RGB').save(path)
  return len(chunk)


def png_jobs(split_dir, prefix, images, labels, indices):
  """(path, pixels) for each kept image, in chunks for the workers."""
  jobs = [(os.path.join(split_dir, CLASS_NAMES[labels[i]],
                        f'{prefix}_{i:05d}.png'), images[i]) for i in indices]
  return [jobs[i:i + CHUNK_SIZE] for i in range(0, len(jobs), CHUNK_SIZE)]


def convert(idx_dir, out_dir, limit_per_class, num_workers):
  """Writes the tree; returns the number of images written (0: up to date)."""
  if limit_per_class < 0:
    raise UsageError('--limit_per_class must be 0 (all) or positive, got '
                     f'{limit_per_class}')
  if num_workers < 1:
    raise UsageError(f'--num_workers must be at least 1, got {num_workers}')
  if not os.path.isdir(idx_dir):
    raise UsageError(f'{idx_dir} does not exist; install Fashion-MNIST with '
                     '`apt-get install dataset-fashion-mnist` or point '
                     '--idx_dir at the directory with its IDX files')
  labels = {split: read_labels(idx_dir, prefix)
            for split, prefix in SPLITS.items()}
  kept = {split: select(labels[split], limit_per_class) for split in SPLITS}
  expected = {split: class_counts(labels[split][kept[split]])
              for split in SPLITS}

  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir):
    if tree_counts(out_dir) == expected:
      return 0
    raise UsageError(f'{out_dir} exists but does not hold this conversion '
                     f'(limit_per_class={limit_per_class}); remove it or '
                     'pass another --out_dir')

  # An interrupted run leaves only this hidden directory, never a partial
  # tree under the final name.
  tmp = os.path.join(os.path.dirname(out_dir),
                     f'.{os.path.basename(out_dir)}.tmp')
  shutil.rmtree(tmp, ignore_errors=True)
  chunks = []
  try:
    for split, prefix in SPLITS.items():
      for name in expected[split]:
        os.makedirs(os.path.join(tmp, split, name))
      images = read_images(idx_dir, prefix, len(labels[split]))
      chunks += png_jobs(os.path.join(tmp, split), prefix, images,
                         labels[split], kept[split])
    with multiprocessing.Pool(min(num_workers, len(chunks))) as pool:
      written = sum(pool.imap_unordered(write_pngs, chunks))
    os.rename(tmp, out_dir)
  except OSError as e:
    raise UsageError(f'cannot write {out_dir} ({e.strerror}); pass a '
                     'writable --out_dir with enough space') from None
  return written
