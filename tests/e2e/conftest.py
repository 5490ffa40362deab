"""The tiny synthetic trained run the end-to-end tool tests share."""

import pytest

from tests.support import runner


@pytest.fixture(scope='session')
def synthetic_run(tmp_path_factory):
  """model_dir of a tiny synthetic run: 2 epochs, ckpt-4, ckpt-8, export,
  plots.

  Shared by the tool tests, which only read it (and add their outputs).
  """
  model_dir = tmp_path_factory.mktemp('synthetic_run') / 'model'
  runner.train_tiny(model_dir, runner.TINY + ['--plots'])
  return str(model_dir)
