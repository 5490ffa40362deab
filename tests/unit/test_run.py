"""run.py's pure parts: the model_dir a run writes to when none is given."""

import os
import stat
import tempfile

import pytest

from common.errors import UsageError
from resnet_keras import run
from tests.support import runner


def test_without_a_model_dir_a_run_gets_a_private_directory_of_its_own(
    tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  cfg = runner.tiny_config('')
  first, second = (run.with_model_dir(cfg, {}).model_dir for _ in range(2))
  assert first != second
  for made in (first, second):
    assert os.path.dirname(made) == str(tmp_path)
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
  given = runner.tiny_config(tmp_path / 'mine')
  assert run.with_model_dir(given, {}) is given


@pytest.mark.parametrize('environ', [
    {'OMPI_COMM_WORLD_RANK': '0', 'OMPI_COMM_WORLD_SIZE': '2'},
    {'TF_CONFIG': '{"cluster": {}}'}])
def test_a_job_of_several_workers_must_name_its_model_dir(environ):
  with pytest.raises(UsageError, match='needs --model_dir'):
    run.with_model_dir(runner.tiny_config(''), environ)
