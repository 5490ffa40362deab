"""The run directory's contract (resnet_keras/rundir/run_directory.py): its
latest checkpoint read from hand-written state files as TensorFlow writes them,
without TensorFlow; the model_dir a run writes to when none is given."""

import os
import stat
import subprocess
import sys
import tempfile

import pytest

from common.errors import UsageError
from resnet_keras.rundir import run_directory
from tests.support import runner

STATE = ('model_checkpoint_path: "{latest}"\n'
         'all_model_checkpoint_paths: "ckpt-8"\n'
         'all_model_checkpoint_paths: "{latest}"\n'
         'all_model_checkpoint_timestamps: 1795650120.5\n'
         'all_model_checkpoint_timestamps: 1795650126.5\n'
         'last_preserved_timestamp: 1795650121.0\n')


def _write(model_dir, latest='ckpt-12', files=('ckpt-12',)):
  (model_dir / run_directory.CHECKPOINT_STATE_FILE).write_text(
      STATE.format(latest=latest))
  for prefix in files:
    (model_dir / f'{prefix}.index').write_text('')
    (model_dir / f'{prefix}.data-00000-of-00001').write_text('')


def test_the_latest_checkpoint_is_the_one_the_state_file_names(tmp_path):
  _write(tmp_path, files=('ckpt-8', 'ckpt-12'))
  latest = run_directory.latest_checkpoint(str(tmp_path))
  assert latest.prefix == str(tmp_path / 'ckpt-12')
  assert latest.step == 12
  assert latest.written == os.path.getmtime(tmp_path / 'checkpoint')


def test_a_path_outside_model_dir_is_none_of_the_runs(tmp_path):
  # The checkpoint manager would restore from it and prune it.
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  _write(elsewhere, files=('ckpt-3',))
  model_dir = tmp_path / 'run'
  model_dir.mkdir()
  _write(model_dir, latest=str(elsewhere / 'ckpt-3'), files=())
  assert run_directory.latest_checkpoint(str(model_dir)) is None
  assert run_directory.checkpoints_outside(str(model_dir)) == [
      str(elsewhere / 'ckpt-3')] * 2
  _write(model_dir, latest='../elsewhere/ckpt-3', files=())
  assert run_directory.checkpoints_outside(str(model_dir)) == [
      str(model_dir / '../elsewhere/ckpt-3')] * 2
  _write(model_dir, files=('ckpt-12',))
  assert run_directory.checkpoints_outside(str(model_dir)) == []


def test_escaped_characters_in_the_path_are_read_back(tmp_path):
  # text_format C-escapes quotes, backslashes and non-ASCII bytes (octal).
  folder = tmp_path / 'a "b" é'
  folder.mkdir()
  escaped = str(folder / 'ckpt-5').replace('"', '\\"').encode()
  escaped = ''.join(chr(b) if b < 128 else f'\\{b:03o}' for b in escaped)
  _write(folder, latest=escaped, files=('ckpt-5',))
  assert run_directory.latest_checkpoint(str(folder)).prefix == str(
      folder / 'ckpt-5')


def test_none_without_a_state_file_a_latest_path_or_its_files(tmp_path):
  assert run_directory.latest_checkpoint(str(tmp_path / 'missing')) is None
  assert run_directory.latest_checkpoint(str(tmp_path)) is None
  (tmp_path / 'checkpoint').write_text('last_preserved_timestamp: 1.0\n')
  assert run_directory.latest_checkpoint(str(tmp_path)) is None
  # Named but deleted (a model_dir emptied by hand): none, as TensorFlow
  # finds none.
  _write(tmp_path, files=('ckpt-8',))
  assert run_directory.latest_checkpoint(str(tmp_path)) is None
  (tmp_path / 'checkpoint').write_bytes(b'\xff\xfe')
  assert run_directory.latest_checkpoint(str(tmp_path)) is None


def test_workers_other_than_the_chief_write_in_their_own_folder():
  assert run_directory.worker_dir('/m', 0) == '/m'
  assert run_directory.worker_dir('/m', 3) == os.path.join('/m', 'worker_3')


def test_it_loads_without_tensorflow():
  # The launcher reads model_dir through it before TensorFlow loads.
  code = ('import sys; from resnet_keras.rundir import run_directory; '
          'print("tensorflow" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], check=True,
                       capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
  assert out.stdout.strip() == 'False'


def test_a_runs_entries_by_name_and_kind():
  assert run_directory.is_run_entry('ckpt-12.data-00000-of-00002', False)
  assert run_directory.is_run_entry('worker_3', True)
  assert run_directory.is_run_entry('.config.json.tmp', False)
  # A name of the contract as the other kind, or near it, is not a run's.
  assert not run_directory.is_run_entry('plots', False)
  assert not run_directory.is_run_entry('config.json', True)
  assert not run_directory.is_run_entry('ckpt-4.index.bak', False)
  assert not run_directory.is_run_entry('.thesis.txt.tmp', False)
  assert not run_directory.is_run_entry('worker_', True)


def test_without_a_model_dir_a_run_gets_a_private_directory_of_its_own(
    tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  cfg = runner.tiny_config('')
  first, second = (run_directory.with_model_dir(cfg, {}).model_dir
                   for _ in range(2))
  assert first != second
  for made in (first, second):
    assert os.path.dirname(made) == str(tmp_path)
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
  given = runner.tiny_config(tmp_path / 'mine')
  assert run_directory.with_model_dir(given, {}) is given


@pytest.mark.parametrize('environ', [
    {'OMPI_COMM_WORLD_RANK': '0', 'OMPI_COMM_WORLD_SIZE': '2'},
    {'TF_CONFIG': '{"cluster": {}}'}])
def test_a_job_of_several_workers_must_name_its_model_dir(environ):
  with pytest.raises(UsageError, match='needs --model_dir'):
    run_directory.with_model_dir(runner.tiny_config(''), environ)
