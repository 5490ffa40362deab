"""scripts/fashion_mnist_to_images.py and its conversion
(resnet_keras/data/fashion_mnist.py) on tiny fake IDX files."""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from common.errors import UsageError
from resnet_keras.data import fashion_mnist as fm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NUM_TRAIN = 20
NUM_TEST = 12


def idx_bytes(array):
  """IDX encoding: zero bytes, type code 0x08 (ubyte), ndim, dims big-endian."""
  header = bytes([0, 0, 0x08, array.ndim])
  header += b''.join(d.to_bytes(4, 'big') for d in array.shape)
  return header + array.astype('>u1').tobytes()


def write_idx(path, array):
  with gzip.open(path, 'wb') as f:
    f.write(idx_bytes(array))


def fake_split(n, seed):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
  labels = (np.arange(n) * 7 + seed) % 10  # every class, in mixed order
  return images, labels.astype(np.uint8)


@pytest.fixture(name='idx_dir')
def fixture_idx_dir(tmp_path):
  """Fake IDX files; returns (dir, {prefix: (images, labels)})."""
  idx = tmp_path / 'idx'
  idx.mkdir()
  data = {'train': fake_split(NUM_TRAIN, 1), 't10k': fake_split(NUM_TEST, 2)}
  for prefix, (images, labels) in data.items():
    write_idx(idx / f'{prefix}-images-idx3-ubyte.gz', images)
    write_idx(idx / f'{prefix}-labels-idx1-ubyte.gz', labels)
  return str(idx), data


def run_script(*args):
  return subprocess.run(
      [sys.executable, '-m', 'scripts.fashion_mnist_to_images', *args],
      cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=120)


def test_parse_idx_reads_big_endian_dims_and_data():
  array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  assert np.array_equal(fm.parse_idx(idx_bytes(array), 'x'), array)
  wide = bytes([0, 0, 0x0B, 1, 0, 0, 0, 2]) + np.array(
      [258, -2], '>i2').tobytes()
  assert fm.parse_idx(wide, 'x').tolist() == [258, -2]


@pytest.mark.parametrize('data', [b'', b'\x08\x03\0\0', idx_bytes(
    np.zeros((2, 2), np.uint8))[:-1]])
def test_parse_idx_rejects_malformed_data(data):
  with pytest.raises(UsageError, match='reinstall dataset-fashion-mnist'):
    fm.parse_idx(data, 'f.gz')


def test_select_keeps_first_n_per_class_in_file_order():
  labels = np.array([3, 1, 3, 3, 1, 0])
  assert fm.select(labels, 0).tolist() == [0, 1, 2, 3, 4, 5]
  assert fm.select(labels, 2).tolist() == [0, 1, 2, 4, 5]


def test_class_names_sort_in_label_order():
  assert sorted(fm.CLASS_NAMES) == list(fm.CLASS_NAMES)
  assert len(fm.CLASS_NAMES) == 10


def test_writes_rgb_png_tree_and_is_idempotent(idx_dir, tmp_path):
  idx, data = idx_dir
  out = str(tmp_path / 'raw')
  result = run_script('--idx_dir', idx, '--out_dir', out, '--num_workers', '2')
  assert result.returncode == 0, result.stderr
  assert f'wrote {NUM_TRAIN + NUM_TEST} images' in result.stdout
  assert sorted(os.listdir(tmp_path)) == ['idx', 'raw']  # no temporary left

  for split, prefix in [('train', 'train'), ('validation', 't10k')]:
    images, labels = data[prefix]
    assert sorted(os.listdir(os.path.join(out, split))) == list(
        fm.CLASS_NAMES)
    for c, name in enumerate(fm.CLASS_NAMES):
      files = sorted(os.listdir(os.path.join(out, split, name)))
      indices = np.flatnonzero(labels == c)
      assert files == [f'{prefix}_{i:05d}.png' for i in indices]
      for file, i in zip(files, indices):
        with Image.open(os.path.join(out, split, name, file)) as image:
          assert (image.format, image.mode, image.size) == (
              'PNG', 'RGB', (28, 28))
          pixels = np.asarray(image)
        assert np.array_equal(pixels, np.repeat(images[i][..., None], 3, 2))

  mtime = os.stat(os.path.join(out, 'train', fm.CLASS_NAMES[0])).st_mtime_ns
  result = run_script('--idx_dir', idx, '--out_dir', out)
  assert result.returncode == 0, result.stderr
  assert 'nothing to do' in result.stdout
  assert os.stat(os.path.join(out, 'train',
                              fm.CLASS_NAMES[0])).st_mtime_ns == mtime


def test_limit_per_class_and_leftover_temporary(idx_dir, tmp_path):
  idx, _ = idx_dir
  out = str(tmp_path / 'raw')
  # What an interrupted run leaves behind.
  os.makedirs(str(tmp_path / '.raw.tmp' / 'train' / fm.CLASS_NAMES[0]))
  assert fm.convert(idx, out, limit_per_class=1, num_workers=1) == 20
  assert not os.path.exists(str(tmp_path / '.raw.tmp'))
  counts = fm.tree_counts(out)
  assert counts == {split: {name: 1 for name in fm.CLASS_NAMES}
                    for split in ('train', 'validation')}
  assert fm.convert(idx, out, limit_per_class=1, num_workers=1) == 0
  with pytest.raises(UsageError, match='remove it or pass another --out_dir'):
    fm.convert(idx, out, limit_per_class=0, num_workers=1)


def test_missing_idx_dir_is_a_one_line_error(tmp_path):
  result = run_script('--idx_dir', str(tmp_path / 'nope'),
                      '--out_dir', str(tmp_path / 'raw'))
  assert result.returncode == 2
  assert result.stderr.count('\n') == 1
  assert 'apt-get install dataset-fashion-mnist' in result.stderr
  assert 'Traceback' not in result.stderr


def test_missing_idx_file_names_it(idx_dir, tmp_path):
  idx, _ = idx_dir
  os.remove(os.path.join(idx, 't10k-images-idx3-ubyte.gz'))
  with pytest.raises(UsageError,
                     match='t10k-images-idx3-ubyte.gz not found; install'):
    fm.convert(idx, str(tmp_path / 'raw'), 0, 1)
  assert not os.path.exists(str(tmp_path / 'raw'))
