"""testbed/soak.py: its rows and table, its command line, and the
catalogue as docs/testing.md lists it."""

import os
import re

import pytest

from testbed import soak
from testbed import soak_jobs
from testbed import soak_plan
from tests.support import soak_records


def test_a_row_names_the_broken_invariant_and_the_table_counts_it():
  hang = soak_records.record(outcome='HANG', seconds_to_named=None)
  assert soak.row(hang).rstrip().endswith('ends: no end within 300 s of the '
                                          'last fault')
  table = soak.summary_table([soak_records.record(), hang])
  assert len(table) == 2
  assert table[1].split()[:8] == ['ssh', 'horovod', 'kill_rank', '2', '1',
                                  '0', '1', '0']


def test_bad_arguments_end_in_one_line(capsys):
  with pytest.raises(SystemExit) as ended:
    soak.main(['--seed', '1', '--backends', 'mpi'])
  assert ended.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: --backends 'mpi': choose from horovod,"
                 'multi_worker_mirrored']


def test_docs_testing_md_lists_the_catalogue():
  with open(os.path.join(soak_jobs.REPO_ROOT, 'docs', 'testing.md')) as f:
    rows = re.findall(r'^\| `(\w+)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$',
                      f.read(), re.MULTILINE)
  assert [name for name, _, _ in rows] == [f.name for f in soak_plan.CATALOGUE]
  for name, _, placements in rows:
    fault = soak_plan.FAULTS[name]
    listed = placements.strip()
    assert (listed == 'all') == (fault.placements == soak_plan.PLACEMENTS), name
    if listed != 'all':
      assert listed.replace('this_host', 'this host').split(', ') == [
          p.replace('this_host', 'this host') for p in fault.placements], name
