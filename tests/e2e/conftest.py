"""The tiny synthetic trained run the end-to-end tool tests share."""

import pytest

from tests.support import built_once
from tests.support import runner


@pytest.fixture(scope='session')
def synthetic_run(tmp_path_factory):
  """model_dir of a tiny synthetic run: 2 epochs, ckpt-4, ckpt-8, export,
  plots.

  Shared by the tool tests, which only read it (and add their outputs):
  trained once per pytest run, each xdist worker given a copy
  (support/built_once.py).
  """
  root = built_once.built_once(
      tmp_path_factory, 'synthetic_run',
      lambda root: runner.train_tiny(root / 'model',
                                     runner.TINY + ['--plots']))
  return str(root / 'model')
