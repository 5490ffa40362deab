"""The run directory's contract (resnet_keras/run_directory.py): its latest
checkpoint read from hand-written state files as TensorFlow writes them,
without TensorFlow."""

import os
import subprocess
import sys

import pytest

from common.errors import UsageError
from resnet_keras import run_directory

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


def test_an_absolute_path_in_the_state_file_stays_as_it_is(tmp_path):
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  _write(elsewhere, files=('ckpt-3',))
  model_dir = tmp_path / 'run'
  model_dir.mkdir()
  _write(model_dir, latest=str(elsewhere / 'ckpt-3'), files=())
  latest = run_directory.latest_checkpoint(str(model_dir))
  assert (latest.prefix, latest.step) == (str(elsewhere / 'ckpt-3'), 3)


def test_escaped_characters_in_the_path_are_read_back(tmp_path):
  # text_format C-escapes quotes, backslashes and non-ASCII bytes (octal).
  folder = tmp_path / 'a "b" é'
  folder.mkdir()
  _write(folder, files=('ckpt-5',))
  escaped = str(folder / 'ckpt-5').replace('"', '\\"').encode()
  escaped = ''.join(chr(b) if b < 128 else f'\\{b:03o}' for b in escaped)
  _write(tmp_path, latest=escaped, files=())
  assert run_directory.latest_checkpoint(str(tmp_path)).prefix == str(
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
  code = ('import sys; from resnet_keras import run_directory; '
          'print("tensorflow" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], check=True,
                       capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
  assert out.stdout.strip() == 'False'


def _run_files(model_dir):
  """A run's entries of every kind, and what a cut-short write leaves."""
  for name in ('config.json', 'metrics.jsonl', 'run_summary.json',
               'checkpoint', 'ckpt-4.index', 'ckpt-4.data-00000-of-00001',
               'checkpoint.tmp3f2a', '.metrics.jsonl.tmp', 'validation.csv'):
    (model_dir / name).write_text('x')
  for name in ('saved_model/variables', 'plots', 'worker_1/checkpoints',
               'exports/ckpt-4', 'averaged', 'ckpt-8_temp', 'train'):
    (model_dir / name).mkdir(parents=True)


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


def test_foreign_entries_are_what_no_run_writes(tmp_path):
  assert run_directory.foreign_entries(str(tmp_path / 'absent')) == []
  _run_files(tmp_path)
  assert run_directory.foreign_entries(str(tmp_path)) == []
  (tmp_path / 'thesis.txt').write_text('mine')
  (tmp_path / 'notes').mkdir()
  (tmp_path / 'eval').symlink_to(tmp_path / 'notes')  # a run's name, a link
  assert run_directory.foreign_entries(str(tmp_path)) == [
      'eval/', 'notes/', 'thesis.txt']


def test_clean_refuses_a_directory_with_foreign_entries_whole(tmp_path):
  _run_files(tmp_path)
  for i in range(5):
    (tmp_path / f'mine{i}.txt').write_text('mine')
  before = sorted(p.name for p in tmp_path.iterdir())
  with pytest.raises(UsageError) as raised:
    run_directory.clean(str(tmp_path))
  message = str(raised.value)
  assert '\n' not in message
  assert 'mine0.txt, mine1.txt, mine2.txt and 2 more' in message
  assert 'choose an empty or new --model_dir' in message
  assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_clean_removes_a_runs_entries_and_keeps_the_directory(tmp_path):
  model_dir = tmp_path / 'run'
  model_dir.mkdir()
  _run_files(model_dir)
  outside = tmp_path / 'outside'
  outside.mkdir()
  (outside / 'keep.txt').write_text('keep')
  # A link inside a run's folder is removed as a link, never followed.
  (model_dir / 'plots' / 'link').symlink_to(outside)
  removed = run_directory.clean(str(model_dir))
  assert 'ckpt-4.index' in removed and 'plots' in removed
  assert model_dir.is_dir() and not list(model_dir.iterdir())
  assert (outside / 'keep.txt').read_text() == 'keep'
  assert run_directory.clean(str(tmp_path / 'absent')) == []
