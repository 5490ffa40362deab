"""docs/run_directory.md against a real run directory and against
run_directory.py: nothing a run writes goes unnamed there, and every name
of the contract is explained."""

import os
import re

from resnet_keras import run_directory
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
