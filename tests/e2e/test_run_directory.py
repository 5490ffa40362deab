"""docs/run_directory.md against a real run directory and against
run_directory.py: nothing a run writes goes unnamed there, and every name
of the contract is explained; --clean on a real run directory removes a
run's entries only."""

import hashlib
import os
import re
import shutil

from resnet_keras.rundir import run_directory
from tests.support import runner

DOC = os.path.join(runner.REPO_ROOT, 'docs', 'run_directory.md')


def _documented():
  """The names in the first column of the doc's table, as patterns."""
  with open(DOC) as f:
    rows = [line for line in f if line.startswith('| `')]
  names = []
  for row in rows:
    cell = row.split('|')[1]
    names += re.findall(r'`([^`]+)`', cell)
  return names


def _matches(entry, names):
  for name in names:
    pattern = re.escape(name.rstrip('/')).replace('N', r'\d+').replace(
        r'\*', '.*')
    if re.fullmatch(pattern, entry):
      return True
  return False


def test_every_entry_of_a_tiny_run_is_documented(synthetic_run):
  names = _documented()
  # The shared run: two epochs, checkpoints, an export and plots (the tool
  # tests may have added their outputs beside them).
  entries = os.listdir(synthetic_run)
  assert {'config.json', 'metrics.jsonl', 'run_summary.json', 'checkpoint',
          'saved_model', 'plots', 'ckpt-8.index'} <= set(entries)
  undocumented = [e for e in entries if not _matches(e, names)]
  assert not undocumented, undocumented


def test_every_name_of_the_contract_is_documented():
  with open(DOC) as f:
    doc = f.read()
  constants = {name: value for name, value in vars(run_directory).items()
               if name.isupper() and isinstance(value, str)}
  assert len(constants) >= 20
  missing = [f'{name}={value}' for name, value in constants.items()
             if f'`{value}' not in doc and f'{value}`' not in doc
             and f'/{value}' not in doc]
  assert not missing, missing


def _tree(path):
  """Every entry under `path` (links as links) with its content's hash."""
  tree = {}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(root, name)
      if os.path.islink(full):
        tree[full] = 'link ' + os.readlink(full)
      elif os.path.isfile(full):
        with open(full, 'rb') as f:
          tree[full] = hashlib.sha256(f.read()).hexdigest()
      else:
        tree[full] = 'dir'
  return tree


def test_clean_refuses_a_run_directory_holding_foreign_entries(
    synthetic_run, tmp_path):
  model_dir = tmp_path / 'model'
  shutil.copytree(synthetic_run, model_dir)
  (model_dir / 'thesis.txt').write_text('years of work')
  (model_dir / 'data').mkdir()
  (model_dir / 'data' / 'train-00000').write_text('records')
  before = _tree(tmp_path)
  result = runner.run_main(runner.TINY + ['-md', str(model_dir), '--clean'])
  assert result.returncode == 2
  runner.assert_one_line_error(result, '--clean', 'data/, thesis.txt',
                               'nothing was removed')
  assert _tree(tmp_path) == before


def test_clean_removes_what_the_run_wrote_and_refuses_a_link(synthetic_run,
                                                            tmp_path):
  model_dir = tmp_path / 'model'
  shutil.copytree(synthetic_run, model_dir)
  outside = tmp_path / 'outside'
  outside.mkdir()
  (outside / 'keep.txt').write_text('keep')
  (model_dir / 'plots' / 'elsewhere').symlink_to(outside)
  before = _tree(tmp_path)
  result = runner.run_main(runner.TINY + ['-md', str(model_dir), '--clean'])
  assert result.returncode == 2
  runner.assert_one_line_error(result, 'plots/elsewhere is a symbolic link')
  assert _tree(tmp_path) == before
  (model_dir / 'plots' / 'elsewhere').unlink()
  (model_dir / 'plots' / 'mine.png').write_text('a user\'s')
  result = runner.run_main(runner.TINY + ['-md', str(model_dir), '--clean'])
  assert result.returncode == 0, result.stderr[-2000:]
  # A new run: its own files only, none of the copied run's checkpoints or
  # its export; the user's file in the run's plots/ stays.
  assert runner.checkpoint_steps(model_dir) == []
  assert not (model_dir / 'saved_model').exists()
  assert runner.read_summary(model_dir)['resumed_from_step'] == 0
  assert (model_dir / 'plots' / 'mine.png').read_text() == 'a user\'s'
  assert (outside / 'keep.txt').read_text() == 'keep'
