"""Shared test setup: the repo on sys.path, TensorFlow set up as in production,
and the tiny trained runs the tool tests share."""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from common import env  # pylint: disable=g-import-not-at-top

env.prepare_tensorflow_environment()

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import e2e  # pylint: disable=g-import-not-at-top,wrong-import-position

@pytest.fixture(scope='session')
def synthetic_run(tmp_path_factory):
  """model_dir of a tiny synthetic run: 2 epochs, ckpt-4, ckpt-8, export.

  Shared by the tool tests, which only read it (and add their outputs).
  """
  model_dir = tmp_path_factory.mktemp('synthetic_run') / 'model'
  e2e.train_tiny(model_dir)
  return str(model_dir)

