"""The Fashion-MNIST conversion (resnet_keras/data/fashion_mnist.py) on
tiny fake IDX files, in this process. (scripts/fashion_mnist_to_images.py
as users run it: e2e/.)"""

import os

import numpy as np
import pytest

from common.errors import UsageError
from resnet_keras.data import fashion_mnist as fm
from tests.support.datasets import idx_bytes


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


def test_missing_idx_file_names_it(idx_dir, tmp_path):
  idx, _ = idx_dir
  os.remove(os.path.join(idx, 't10k-images-idx3-ubyte.gz'))
  with pytest.raises(UsageError,
                     match='t10k-images-idx3-ubyte.gz not found; install'):
    fm.convert(idx, str(tmp_path / 'raw'), 0, 1)
  assert not os.path.exists(str(tmp_path / 'raw'))
