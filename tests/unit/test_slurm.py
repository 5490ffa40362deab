"""Slurm read without a Slurm: its node lists (common/slurm.py), what a job
tells its processes (common/worker_contract.py), what the launcher asks it
(launcher/slurm.py), and the trainer's record of a scheduled run
(job_starts.py). The real Slurm: multihost/test_slurm.py."""

import pytest

from common import slurm as node_lists
from common import worker_contract as contract
from common.errors import UsageError
from resnet_keras.training import job_starts
from resnet_keras.launcher import slurm


@pytest.mark.parametrize('nodelist,nodes', [
    ('s[1-3,7]', ['s1', 's2', 's3', 's7']),
    ('a1,b[01-02]', ['a1', 'b01', 'b02']),
    ('r[1-2]-n[8-10]', ['r1-n8', 'r1-n9', 'r1-n10', 'r2-n8', 'r2-n9',
                        'r2-n10']),
    ('node7', ['node7']),
])
def test_node_lists_expand_as_slurm_writes_them(nodelist, nodes):
  assert node_lists.expand_nodelist(nodelist) == nodes


def test_long_and_mixed_node_lists_expand_in_order():
  nodes = node_lists.expand_nodelist('gpu[0001-0512,0600-0999]')
  assert len(nodes) == 912
  assert nodes[:2] == ['gpu0001', 'gpu0002']
  assert nodes[511:513] == ['gpu0512', 'gpu0600'] and nodes[-1] == 'gpu0999'
  assert node_lists.expand_nodelist('n[1-3,7],m[01-02]') == [
      'n1', 'n2', 'n3', 'n7', 'm01', 'm02']
  # A range wider than its first number keeps that number's width.
  assert node_lists.expand_nodelist('n[098-101]') == ['n098', 'n099', 'n100',
                                                 'n101']


@pytest.mark.parametrize('nodes,compressed', [
    (['n1', 'n2', 'n3', 'n7'], 'n[1-3,7]'),
    (['n1', 'n2', 'n3', 'n7', 'm01', 'm02'], 'n[1-3,7],m[01-02]'),
    (['n8', 'n9', 'n10'], 'n[8-10]'),
    (['n09', 'n10', 'n011'], 'n[09-10,011]'),  # Each number at its width.
    (['r1-n1', 'r1-n2', 'r2-n1'], 'r1-n[1-2],r2-n1'),
    (['n3', 'n1'], 'n[3,1]'),  # In their order: ranks follow it.
    (['n1', 'm1', 'n2'], 'n1,m1,n2'),
    (['node7'], 'node7'),
    (['login', 'n1', 'n2'], 'login,n[1-2]'),
])
def test_node_lists_compress_as_slurm_writes_them(nodes, compressed):
  assert node_lists.compress_nodelist(nodes) == compressed
  assert node_lists.expand_nodelist(compressed) == nodes


def test_a_thousand_nodes_compress_to_one_range():
  nodes = node_lists.expand_nodelist('gpu[0001-0512,0600-0999]')
  assert node_lists.compress_nodelist(nodes) == 'gpu[0001-0512,0600-0999]'


def test_tasks_per_node_and_bad_lists():
  assert slurm.tasks_per_node('2(x3),1') == [2, 2, 2, 1]
  assert slurm.tasks_per_node('4') == [4]
  with pytest.raises(UsageError, match="^cannot read SLURM_TASKS_PER_NODE="
                     "'abc': Slurm writes counts per node such as 2"):
    slurm.tasks_per_node('abc')
  for bad in ('s[a-b]', 's[1-x]', 'n[1-', 'n[1-]', 'n1]', 'n[[1]]', 'n[1'):
    with pytest.raises(Exception, match='cannot read the Slurm node list'):
      node_lists.expand_nodelist(bad)
  # What srun would read as an option, or a shell as more than a name.
  for bad in ('-n1', 'n[1-2],-x', 'n 1'):
    with pytest.raises(Exception, match='is not a host name'):
      node_lists.expand_nodelist(bad)


def test_a_task_reads_its_step_nodes_and_a_batch_script_the_jobs():
  job = {'SLURM_JOB_NODELIST': 'n[1-3]'}
  assert contract.slurm_step_nodes(job) == ['n1', 'n2', 'n3']
  # After a node failure (--no-kill) the next step runs on fewer nodes.
  assert contract.slurm_step_nodes({**job, 'SLURM_STEP_NODELIST': 'n[1-2]'}) == [
      'n1', 'n2']


def test_the_nodes_a_job_holds_now_and_a_refused_requeue(monkeypatch):
  answers = {
      ('show', 'job', '--oneliner', '9'): (
          True, 'JobId=9 JobName=x ReqNodeList=(null) ExcNodeList=(null) '
          'NodeList=n[1-2] BatchHost=n1 NumNodes=2\n'),
      ('requeue', '9'): (False, 'scontrol: error: Requested operation is '
                         'presently disabled for job 9'),
  }
  monkeypatch.setattr(slurm, '_scontrol', lambda *args: answers.get(
      args, (False, 'no Slurm')))
  assert slurm.job_nodes('9') == ['n1', 'n2']
  assert slurm.job_nodes('10') is None
  assert 'presently disabled' in slurm.requeue('9')


SLURM_JOB = {'SLURM_JOB_ID': '31', 'SLURM_JOB_NODELIST': 'n[1-3]',
             'SLURM_STEP_NODELIST': 'n[1-3]'}


def test_a_scheduled_run_records_each_start_and_the_signal_that_stopped_it(
    tmp_path):
  model_dir = str(tmp_path)
  job_starts.record_start(model_dir, SLURM_JOB, step=0)
  job_starts.record_stop(model_dir, SLURM_JOB, 'SIGUSR1', step=12)
  requeued = {**SLURM_JOB, 'SLURM_RESTART_COUNT': '1'}
  job_starts.record_start(model_dir, requeued, step=12)
  summary = job_starts.summary(model_dir, requeued)
  assert (summary['name'], summary['job_id'], summary['requeues']) == (
      'slurm', '31', 1)
  assert summary['nodes'] == ['n1', 'n2', 'n3']
  first, second = summary['starts']
  assert (first['requeues'], first['step'], first['stopped_by'],
          first['saved_at_step']) == (0, 0, 'SIGUSR1', 12)
  assert (second['requeues'], second['step']) == (1, 12)
  assert 'stopped_by' not in second


def test_outside_slurm_nothing_is_recorded(tmp_path):
  job_starts.record_start(str(tmp_path), {}, step=0)
  job_starts.record_stop(str(tmp_path), {}, 'SIGTERM', step=3)
  assert job_starts.summary(str(tmp_path), {}) is None
  assert not list(tmp_path.iterdir())
