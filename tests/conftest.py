"""Shared test setup: the repo on sys.path, TensorFlow set up as in production."""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from common import env  # pylint: disable=g-import-not-at-top

env.prepare_tensorflow_environment()
