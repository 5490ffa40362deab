"""A directory the whole pytest run builds once, each xdist worker reading a
copy of its own: the trained runs the session fixtures share
(tests/conftest.py's records_run, e2e/conftest.py's synthetic_run).

A session fixture is built once per process, and scripts/test.sh runs up to
4 workers: each trained the same seeded runs again. Here the first worker to
ask builds the directory under the run's shared temporary folder (the
parent of every worker's basetemp), holding a lock meanwhile; the others
wait for it and copy. Each worker gets a copy because the tests add their
outputs beside the run (validation.csv, exports/, averaged/): in one shared
directory one worker's output would change what another worker's test
reads. A build that fails fails in every worker that asks, as before.
"""

import contextlib
import fcntl
import os
import pathlib
import shutil
from typing import Callable


@contextlib.contextmanager
def _locked(path: pathlib.Path):
  with open(path, 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def built_once(tmp_path_factory, name: str,
               build: Callable[[pathlib.Path], None]) -> pathlib.Path:
  """A directory of this worker's that `build(directory)` filled: built here
  without xdist, else copied from the one build of the whole run."""
  mine = tmp_path_factory.mktemp(name)
  if 'PYTEST_XDIST_WORKER' not in os.environ:
    build(mine)
    return mine
  shared_root = tmp_path_factory.getbasetemp().parent
  shared = shared_root / f'built_once_{name}'
  done = shared_root / f'built_once_{name}.done'
  with _locked(shared_root / f'built_once_{name}.lock'):
    if not done.exists():
      shutil.rmtree(shared, ignore_errors=True)  # An earlier build that failed.
      shared.mkdir()
      build(shared)
      done.touch()
  shutil.copytree(shared, mine, dirs_exist_ok=True, symlinks=True)
  return mine
