"""testbed/soak/faults.py: a fault lands only where the world shows it,
never on the fault call's own word. Real child processes stand in for
ranks and launchers; stand-ins for Slurm and the cluster answer as they
would when a command is taken and nothing changes."""

import signal
import subprocess
import types

import pytest

from testbed import cluster
from testbed.soak import faults as soak_faults
from tests.support import soak_records


@pytest.fixture(autouse=True)
def _quick(monkeypatch):
  # A landing that never shows is waited for this long, not 5 s.
  monkeypatch.setattr(soak_faults, 'SHOW_SECONDS', 0.3)


@pytest.fixture
def child():
  process = subprocess.Popen(['sleep', '60'])
  yield process
  process.kill()
  process.wait()


class _Ranks:
  """Processes.signal_rank over one child; `sends` False: it says it
  signalled but did not (what the world must catch)."""

  def __init__(self, process, sends=True):
    self.process, self.sends = process, sends

  def signal_rank(self, plan, sig):
    del plan
    if self.sends:
      self.process.send_signal(sig)
    return self.process.pid, f'pid {self.process.pid}'


@pytest.mark.parametrize('sig,wanted,shows', [
    (signal.SIGKILL, soak_faults.GONE, 'ended (not yet reaped)'),
    (signal.SIGSTOP, soak_faults.STOPPED, 'stopped')])
def test_a_signalled_rank_lands_once_the_kernel_shows_it(child, sig, wanted,
                                                         shows):
  landing = soak_faults._signal_rank(_Ranks(child), None, sig, wanted)
  assert landing == (f'pid {child.pid}', True, f'pid {child.pid} {shows}', '')


def test_a_rank_said_signalled_but_running_did_not_land(child):
  landing = soak_faults._signal_rank(_Ranks(child, sends=False), None,
                                     signal.SIGKILL, soak_faults.GONE)
  assert (landing.landed, landing.evidence) == (
      False, f'pid {child.pid} still in state S')


def test_no_rank_to_signal_does_not_land():
  ranks = types.SimpleNamespace(
      signal_rank=lambda plan, sig: (None, 'no rank running'))
  assert soak_faults._signal_rank(ranks, None, signal.SIGKILL,
                                  soak_faults.GONE) == (
                                      'no rank running', False,
                                      'no rank running', '')


def test_the_launcher_killed_lands_by_its_exit_and_not_once_it_ended(child):
  assert soak_faults._kill_launcher(child) == (
      f'pid {child.pid}', True, 'the launcher ended with -9', '')
  again = soak_faults._kill_launcher(child)
  assert not again.landed
  assert again.evidence == 'the launcher had already ended (exit -9)'


def test_a_full_disk_lands_only_with_the_space_gone(tmp_path, monkeypatch):
  model_dir = str(tmp_path / 'model')
  timers = []
  # fallocate refused, or taking no room, leaves the disk as it was.
  def refuse(fd, offset, length):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(soak_faults.os, 'posix_fallocate', refuse)
  landing = soak_faults._fill(model_dir, timers)
  assert not landing.landed
  assert landing.evidence == 'fallocate: [Errno 28] No space left on device'
  monkeypatch.setattr(soak_faults.os, 'posix_fallocate', lambda *a: None)
  landing = soak_faults._fill(model_dir, timers)
  assert not landing.landed and landing.evidence.endswith(
      f'bytes left on {tmp_path}')
  statvfs = lambda path: types.SimpleNamespace(f_bavail=8, f_frsize=4096)
  monkeypatch.setattr(soak_faults.os, 'statvfs', statvfs)
  assert soak_faults._fill(model_dir, timers).landed
  # Each filler is removed 10 s on, and removing it twice is harmless.
  for _, remove in timers:
    remove()
  assert not (tmp_path / 'filler').exists()


def test_a_link_cut_lands_when_the_switch_shows_it_down():
  def cluster_whose_link_stays(up):
    return types.SimpleNamespace(cut_link=lambda host: None,
                                 link_up=lambda host: up)
  host = types.SimpleNamespace(name='h2')
  assert soak_faults._cut(cluster_whose_link_stays(False), host, [],
                          heal_after=None).landed
  timers = []
  stayed = soak_faults._cut(cluster_whose_link_stays(True), host, timers,
                            heal_after=20)
  assert (stayed.landed, stayed.evidence) == (False, "h2's link still up")
  assert len(timers) == 1


def test_the_switchs_link_flags():
  assert cluster.link_flags_up(
      '5: h1b@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP')
  # Set down, with its carrier still there: the flags say it.
  assert not cluster.link_flags_up(
      '5: h1b@if4: <BROADCAST,MULTICAST,LOWER_UP> mtu 1500 state UP')
  assert not cluster.link_flags_up('Device "h1b" does not exist.')


class _Slurm:
  """Answers each command by its first two words; records them."""

  def __init__(self, answers):
    self.answers, self.ran = answers, []

  def run(self, argv):
    self.ran.append(argv)
    code, out, err = self.answers.get(' '.join(argv[:2]), (0, '', ''))
    if callable(out):
      out = out()
    return subprocess.CompletedProcess(argv, code, out, err)


def test_a_requeue_lands_only_if_slurm_counts_a_restart():
  restarts = iter([0, 1])
  counts = lambda: f'JobId=5 JobState=PENDING Restarts={next(restarts)} '
  taken = _Slurm({'scontrol show': (0, counts, '')})
  assert soak_faults._requeue(taken, '5') == (
      'scontrol requeue', True, 'Slurm counts 1 restarts of the job, 0 before',
      '')
  ignored = _Slurm({'scontrol show': (0, 'JobId=5 Restarts=0', '')})
  assert not soak_faults._requeue(ignored, '5').landed
  refused = _Slurm({'scontrol requeue': (1, '', 'Job is not requeueable')})
  assert soak_faults._requeue(refused, '5') == (
      'scontrol requeue', False, 'Job is not requeueable', '')


def test_a_node_set_down_lands_if_slurm_has_it_down_or_the_job_lost_it():
  host = types.SimpleNamespace(name='h2')
  down = _Slurm({'scontrol show': (0, 'NodeName=h2 State=DOWN+DRAIN x', '')})
  assert soak_faults._node_down(down, host).landed
  # Back in service before a read saw it DOWN (ReturnToService=2): the
  # job's lines decide.
  idle = _Slurm({'scontrol show': (0, 'NodeName=h2 State=IDLE x', '')})
  missed = soak_faults._node_down(idle, host)
  assert missed[:3] == ('h2', None, 'Slurm has h2 in state IDLE')
  for lines, landed in [
      ([], False), (['srun: error: Node failure on h3'], False),
      (['srun: error: Node failure on h2'], True),
      (['12:00:01 E job failed after 9 s (exit 137): Slurm lost node h2 '
        '(rank 1): it went down or its network failed'], True)]:
    fault = soak_records.fault('slurm_node_down', landed=None, evidence='',
                               awaits=missed.awaits)
    soak_faults.confirm(fault, lines)
    assert fault.landed is landed, lines


def test_a_cancelled_step_awaits_slurmstepds_line():
  no_step = _Slurm({'squeue -h': (0, '5.batch\n', '')})
  assert soak_faults._cancel_step(no_step, '5').landed is False
  refused = _Slurm({'squeue -h': (0, '5.batch\n5.0\n', ''),
                    'scancel 5.0': (1, '', 'Invalid job id')})
  assert soak_faults._cancel_step(refused, '5').evidence == 'Invalid job id'
  taken = soak_faults._cancel_step(
      _Slurm({'squeue -h': (0, '5.batch\n5.0\n', '')}), '5')
  assert taken.landed is None
  fault = soak_records.fault('slurm_cancel_step', landed=None, evidence='',
                             awaits=taken.awaits)
  soak_faults.confirm(fault, ['srun: error: h2: task 1: Terminated'])
  assert fault.landed is False
  fault.landed = None
  shown = ('slurmstepd: error: *** STEP 5.0 ON h1 CANCELLED AT '
           '2026-11-29T10:00:00 ***')
  soak_faults.confirm(fault, [shown])
  assert (fault.landed, fault.evidence) == (True, shown)


@pytest.mark.parametrize('awaits,line', [
    (soak_faults.STOPPED_BY_SIGTERM,
     'job stopped by SIGTERM to the launcher (exit 143)'),
    (soak_faults.WARNED, 'slurm job 5 signalled (SIGUSR1): the workers saved '
     'at step 8 and stopped; requeued'),
    (soak_faults.WARNED, 'job failed after 9 s (exit 138): rank 1 on host '
     'h2 was killed by SIGUSR1 (10); restarting')])
def test_the_jobs_line_decides_a_fault_only_it_can_show(awaits, line):
  fault = soak_records.fault(landed=None, evidence='', awaits=awaits)
  soak_faults.confirm(fault, ['12:00:01 I step 8/24 | loss'])
  assert fault.landed is False
  assert fault.evidence.startswith('no line after it matches')
  fault.landed = None
  soak_faults.confirm(fault, ['12:00:01 I step 8/24 | loss', line])
  assert fault.landed is True and fault.evidence == line
  # A fault already decided is not decided again by a later line.
  refused = soak_records.fault(landed=False, evidence='exit 1',
                               awaits=awaits)
  soak_faults.confirm(refused, [line])
  assert (refused.landed, refused.evidence) == (False, 'exit 1')
