"""python -m scripts.fashion_mnist_to_images as users run it (a short
process of its own), on tiny fake IDX files: the PNG tree it writes, a
rerun that does nothing, its one-line error. (The conversion in this
process: unit/.)"""

import os
import subprocess
import sys

import numpy as np
from PIL import Image

from resnet_keras.data import fashion_mnist as fm
from tests.support.datasets import NUM_TEST, NUM_TRAIN
from tests.support.runner import REPO_ROOT


def run_script(*args):
  return subprocess.run(
      [sys.executable, '-m', 'scripts.fashion_mnist_to_images', *args],
      cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=120)


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


def test_missing_idx_dir_is_a_one_line_error(tmp_path):
  result = run_script('--idx_dir', str(tmp_path / 'nope'),
                      '--out_dir', str(tmp_path / 'raw'))
  assert result.returncode == 2
  assert result.stderr.count('\n') == 1
  assert 'apt-get install dataset-fashion-mnist' in result.stderr
  assert 'Traceback' not in result.stderr
