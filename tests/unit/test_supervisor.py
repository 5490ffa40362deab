"""The launcher's supervisor: a job run, its output passed through and read,
restarts, and the job ended when mpirun or a worker hangs."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from common.errors import UsageError
from resnet_keras.launcher import failures
from resnet_keras.launcher import regrowth
from resnet_keras.launcher import supervisor
from tests.support.launcher_output import (ABORT_NOTICES, SRUN,
                                           SRUN_NODE_FAILURE, SRUN_TASK_EXIT)
from tests.support.runner import REPO_ROOT


def test_workers_stopped_at_the_warning_are_neither_failed_nor_restarted(
    tmp_path):
  """srun's exit code is that of the tasks it ended (143); its first task
  stopped at the scheduler's warning: the caller has the job resumed."""
  script = (f'print({SRUN_TASK_EXIT!r}, flush=True)\n'
            'import sys; sys.exit(143)')
  code, lines = _supervise(tmp_path, script, max_restarts=2,
                           launcher_output=SRUN)
  assert code == supervisor.STOPPED_AT_WARNING_EXIT_CODE == 138
  assert lines == []


def test_a_node_failure_that_ends_the_job_is_named_in_the_stop_line(
    tmp_path):
  """Slurm ends a job that lost a node (without --no-kill) with SIGTERM to
  its batch script, the launcher: its last line names the node."""
  script = (f'import os, signal, time\nprint({SRUN_NODE_FAILURE!r}, '
            'flush=True)\nos.kill(os.getppid(), signal.SIGTERM)\n'
            'time.sleep(60)')
  code, lines = _supervise(tmp_path, script, max_restarts=2,
                           launcher_output=SRUN)
  assert code == 143
  assert lines[-1].startswith('job stopped by SIGTERM (15) to the launcher '
                              '(exit 143): Slurm lost node s3')
  assert 'sbatch --no-kill' in lines[-1]


def _supervise(tmp_path, script, max_restarts, replan=None,
               parse_output=True, abort_grace=0, launcher_output=None):
  lines = []
  code = supervisor.Supervisor(
      failures.Attempt([sys.executable, '-c', script, str(tmp_path)], {}),
      max_restarts=max_restarts, workers_per_host=1,
      parse_output=parse_output, log=lines.append, replan=replan,
      abort_grace=abort_grace, launcher_output=launcher_output).run()
  return code, lines


def _aborting_mpirun(then, notice=ABORT_NOTICES['aborted']):
  """A stand-in for mpirun: a child holding the output pipe from a process
  group of its own (as OpenMPI starts its ssh sessions and local ranks),
  its session's id, the abort notice, then `then` (Python lines)."""
  return ('import os, subprocess, sys, time\n'
          'subprocess.Popen([sys.executable, "-c", "import time; '
          'time.sleep(90)"], process_group=0)\n'
          'print("session", os.getsid(0), flush=True)\n'
          f'print({notice!r}, flush=True)\n' + then)


# Fails (by SIGKILL) until it has run `n` times; records each attempt's
# restart count as the launcher passes it on.
FLAKY = '''
import os, signal, sys
runs = os.path.join(sys.argv[1], 'runs')
with open(runs, 'a') as f:
    f.write(os.environ['RESNET_KERAS_RESTARTS'] + '\\n')
with open(runs + '.job', 'a') as f:
    f.write(os.environ['RESNET_KERAS_JOB'] + '\\n')
if len(open(runs).read().split()) < {n}:
    os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_job_that_fails_is_restarted_up_to_max_restarts(tmp_path):
  code, lines = _supervise(tmp_path, FLAKY.format(n=3), max_restarts=2)
  assert code == 0
  assert (tmp_path / 'runs').read_text().split() == ['0', '1', '2']
  # One job: each attempt may take the run directory over from the last.
  jobs = (tmp_path / 'runs.job').read_text().split()
  assert len(jobs) == 3 and len(set(jobs)) == 1 and jobs[0]
  restarts = [line for line in lines if line.startswith('restart ')]
  assert restarts == ['restart 1 of 2: the job exited with code 137 '
                      '(SIGKILL (9))', 'restart 2 of 2: the job exited with '
                      'code 137 (SIGKILL (9))']


def test_restarts_end_when_used_up_with_the_last_exit_code(tmp_path):
  code, lines = _supervise(tmp_path, FLAKY.format(n=5), max_restarts=1,
                           parse_output=False)
  assert code == 128 + signal.SIGKILL
  assert len((tmp_path / 'runs').read_text().split()) == 2
  assert 'check that host and rerun' in lines[-1]


def test_replan_gives_each_restart_its_command_or_ends_the_job(tmp_path):
  """An elastic launcher's replan: the second attempt runs what replan
  returned (its environment here), the next replan's UsageError ends the
  job with its message as the last line."""
  seen_failures = []

  def replan(failure):
    seen_failures.append(failure)
    if len(seen_failures) == 2:
      raise UsageError('only 1 of 3 hosts left, --min_hosts=2')
    seen = ('import os, sys; open(sys.argv[1] + "/seen", "a").write('
            'os.environ["WHERE"] + os.environ["RESNET_KERAS_RESTARTS"] + '
            '"@" + os.environ["RESNET_KERAS_RESUME_STEP"]); sys.exit(1)')
    return failures.Attempt([sys.executable, '-c', seen, str(tmp_path)],
                            {'WHERE': 'b'}, hosts=['b'], resume_step=8)

  code, lines = _supervise(tmp_path, FLAKY.format(n=5), max_restarts=3,
                           replan=replan)
  assert code == 1
  assert len((tmp_path / 'runs').read_text().split()) == 1
  # The attempt's resume step reaches its workers (the trainer checks it).
  assert (tmp_path / 'seen').read_text() == 'b1@8'
  assert [f.exit_code for f in seen_failures] == [137, 1]
  assert lines[-1] == 'only 1 of 3 hosts left, --min_hosts=2'


def test_a_host_that_answers_again_has_the_workers_save_and_the_job_grow(
    tmp_path, monkeypatch):
  """While an attempt runs, regrowth says a dropped host answers again: the
  workers get the warning signal, save and stop (138), and the attempt
  replan gives runs, an attempt later and without a restart: a job of
  --max_restarts=0 grows too."""
  monkeypatch.setattr(regrowth, 'POLL', 0.05)
  ready = tmp_path / 'ready'
  first = ('import os, signal, sys, time\n'
           'signal.signal(signal.SIGUSR1, lambda *_: sys.exit(138))\n'
           'open(sys.argv[1] + "/ready", "w").close()\n'
           'time.sleep(60)\nsys.exit(1)')
  asked, replanned = [], []

  def returning():  # As a job's: none once the host is back.
    answers = ready.exists() and not replanned
    asked.append(answers)
    return 'elastic: host(s) h3 answer again' if answers else None

  def replan(failure):
    replanned.append(failure)
    grown = ('import os, sys; open(sys.argv[1] + "/grown", "w").write('
             'os.environ["RESNET_KERAS_RESTARTS"] + "@" + '
             'os.environ["RESNET_KERAS_RESUME_STEP"])')
    return failures.Attempt([sys.executable, '-c', grown, str(tmp_path)], {},
                            hosts=['a', 'b', 'h3'], resume_step=8)

  lines = []
  code = supervisor.Supervisor(
      failures.Attempt([sys.executable, '-c', first, str(tmp_path)], {}),
      max_restarts=0, workers_per_host=1, parse_output=True,
      log=lines.append, replan=replan, regrowth_check=returning).run()
  assert code == 0, lines
  assert replanned == [None]
  assert (tmp_path / 'grown').read_text() == '1@8'
  assert lines == ['elastic: host(s) h3 answer again: the workers save at '
                   'the next step and stop, and the job restarts with it']
  # Asked until the host answered, then only by the grown attempt.
  assert asked.count(True) == 1


def _assert_session_ends(output):
  """The stand-in mpirun's session (the id it printed) has no process left
  within 10 s: a killed process closes its files (the pipe's end) before
  it is gone."""
  session = int(re.search(r'session (\d+)', output).group(1))
  deadline = time.monotonic() + 10
  while supervisor.session_processes(session) and (
      time.monotonic() < deadline):
    time.sleep(0.1)
  assert not supervisor.session_processes(session)


@pytest.mark.parametrize('notice', list(ABORT_NOTICES))
def test_an_mpirun_that_hangs_while_aborting_is_ended_after_the_grace(
    tmp_path, capfd, notice):
  """mpirun's abort notice, then a hang (it waits for a daemon that will
  not answer), with a child holding the output pipe from a process group
  of its own, as OpenMPI starts its ssh sessions and local ranks: the whole
  session ends abort_grace after the notice, that child with it. (The lost
  daemon's notice, then a hang: the elastic test's two hosts cut at once.)"""
  hang = _aborting_mpirun('time.sleep(600)\n', ABORT_NOTICES[notice])
  started = time.monotonic()
  code, lines = _supervise(tmp_path, hang, max_restarts=0, abort_grace=1)
  assert time.monotonic() - started < 60
  assert code == 128 + signal.SIGTERM
  assert lines[0] == ('mpirun did not end the job within 1 s of aborting '
                      'it (a host stopped answering): ending mpirun')
  _assert_session_ends(capfd.readouterr().out)


def test_a_job_whose_chief_finished_but_a_worker_hangs_is_ended_as_done(
    tmp_path, capfd, monkeypatch):
  """The chief's summary line, then a worker that never leaves (frozen
  during the export, after the last collective): the job is ended after
  the workers' grace, the line says why, and the job succeeded: it is not
  restarted."""
  monkeypatch.setattr(supervisor, '_LEAVE_GRACE', 1)
  frozen = _aborting_mpirun(
      'print("12:00:00 I run summary: {}", flush=True)\n'
      'time.sleep(600)\n', notice='')
  code, lines = _supervise(tmp_path, frozen, max_restarts=2, abort_grace=1)
  assert code == 0
  assert lines == ['the chief finished the run (run_summary.json written), '
                   'but 1 s later the job had not ended: a worker is stuck '
                   'or frozen; ending the job (its results are complete)']
  _assert_session_ends(capfd.readouterr().out)


def test_a_job_that_leaves_after_its_chief_finished_is_left_alone(tmp_path):
  done = 'print("12:00:00 I run summary: {}", flush=True)\n'
  code, lines = _supervise(tmp_path, done, max_restarts=0, abort_grace=1)
  assert code == 0 and lines == []


def test_a_usage_error_is_never_retried(tmp_path):
  script = ('import sys; open(sys.argv[1] + "/runs", "a").write("x");'
            'sys.exit(2)')
  code, lines = _supervise(tmp_path, script, max_restarts=3)
  assert code == 2
  assert (tmp_path / 'runs').read_text() == 'x'
  assert lines[-1].endswith('fix the cause and rerun')


def test_negative_max_restarts_is_a_usage_error():
  with pytest.raises(UsageError, match='--max_restarts must be >= 0'):
    supervisor.Supervisor(failures.Attempt(['true'], {}), max_restarts=-1,
                          workers_per_host=1, parse_output=False,
                          log=print)


def test_an_mpirun_that_exits_leaving_its_ssh_session_is_ended_after_the_grace(
    tmp_path):
  """mpirun's abort notice, then mpirun exits (1) while one of its ssh
  sessions, to a host whose link was cut, lives on holding the output
  pipe: the launcher ends that session abort_grace after the notice, and
  the job's exit code is mpirun's (seen in the elastic test: the launcher
  waited on the pipe, with no restart, until the test gave up)."""
  exits = _aborting_mpirun('sys.exit(1)\n')
  started = time.monotonic()
  code, lines = _supervise(tmp_path, exits, max_restarts=0, abort_grace=1)
  assert time.monotonic() - started < 60
  assert code == 1
  assert lines[0].startswith('mpirun did not end the job within 1 s')


_LAUNCHER = '''
import sys
from resnet_keras.launcher import failures
from resnet_keras.launcher import supervisor
# The signal's number written whole before the file has its name: the
# test polls for the file and reads it at once.
job = """
import os, signal, sys, time
def stop(signum, frame):
  open(sys.argv[1] + "/stopping", "w").write(str(signum))
  os.rename(sys.argv[1] + "/stopping", sys.argv[1] + "/stopped")
  sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + "/started", "w").close()
time.sleep(60)
"""
supervisor.Supervisor(
    failures.Attempt([sys.executable, "-c", job, sys.argv[1]], {}),
    max_restarts=0, workers_per_host=1, parse_output=True,
    log=print).run()
'''


def test_a_launcher_killed_by_sigkill_takes_its_job_with_it(tmp_path):
  """kill -9 of the launcher: its job (mpirun, in a session of its own)
  gets SIGTERM from the kernel instead of training on unsupervised."""
  launcher = subprocess.Popen([sys.executable, '-c', _LAUNCHER,
                               str(tmp_path)], cwd=REPO_ROOT)
  try:
    deadline = time.monotonic() + 60
    while not (tmp_path / 'started').exists():
      assert launcher.poll() is None and time.monotonic() < deadline
      time.sleep(0.1)  # Polls for the job's start.
    launcher.kill()
    launcher.wait(timeout=10)
    while not (tmp_path / 'stopped').exists():
      assert time.monotonic() < deadline, 'the job outlived its launcher'
      time.sleep(0.1)  # Polls for the job's end.
  finally:
    if launcher.poll() is None:
      launcher.kill()
  assert (tmp_path / 'stopped').read_text() == str(int(signal.SIGTERM))
