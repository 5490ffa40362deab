"""The soak's report (testbed/soak/report.py: its rows and table), its
command line (runner.py), and the catalogue as docs/testing.md lists it."""

import os
import re

import pytest

from testbed.soak import report
from testbed.soak import runner as soak
from testbed.soak import jobs as soak_jobs
from testbed.soak import plan as soak_plan
from testbed.soak.invariants import Restart
from tests.support import soak_records


def test_a_row_names_the_broken_invariant_and_the_table_counts_it():
  hang = soak_records.record(outcome='HANG', seconds_to_named=None)
  assert report.row(hang).rstrip().endswith('ends: no end within 300 s of the '
                                          'last fault')
  table = report.summary_table([soak_records.record(), hang])
  assert len(table) == 2
  assert table[1].split()[:8] == ['ssh', 'horovod', 'kill_rank', '2', '1',
                                  '0', '1', '0']


def test_the_row_and_the_table_give_the_faults_landed_and_the_recoveries():
  recovered = soak_records.record(faults=[soak_records.fault(recovery=31.0)])
  unlanded = soak_records.record(faults=[soak_records.fault(
      landed=False, evidence='no rank running', recovery=500.0)])
  header = report.HEADER.split()
  assert header[6:9] == ['landed', 'named', '1st']
  assert header[9] == 'recov'
  assert report.row(recovered).split()[6] == '1/1'
  assert report.row(recovered).split()[9] == '31.0'
  assert report.row(unlanded).split()[6] == '0/1'
  assert report.row(unlanded).split()[9] == '-'  # Nothing landed to recover.
  table = report.summary_table([recovered, unlanded])
  assert table[0].split()[-2:] == ['landed', 'max_recov']
  assert table[1].split()[-2:] == ['1/2', '31.0']


@pytest.mark.parametrize('changes', [
    dict(outcome='wrong end', summary_steps=None), dict(outcome='missed'),
    dict(faults=[soak_records.fault(landed=False, evidence='gone')]),
    dict(faults=[soak_records.fault(recovery=1000.0)]),
    dict(restarts=[Restart((4, 8), None, True)]),
    dict(reference_weights=None, reference_error='exit 1')])
def test_the_soak_fails_on_any_broken_invariant(changes):
  clean = soak_records.record()
  assert report.verdict([clean], True) == (
      '1 jobs, 0 with a broken invariant; faults landed 1/1', 0)
  line, code = report.verdict([clean, soak_records.record(**changes)], True)
  assert code == 1 and line.startswith('2 jobs, 1 with a broken invariant')


def test_the_verdict_says_when_weights_were_not_compared():
  line, code = report.verdict([soak_records.record(
      weights_compared=False, reference_weights=None)], False)
  assert code == 0
  assert line.endswith('weights not compared (--no_reference)')


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
