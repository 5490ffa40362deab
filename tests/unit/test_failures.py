"""The launcher's failure naming: causes from mpirun's and srun's output."""

import pytest

from resnet_keras.launcher import failures
from tests.support.launcher_output import (EXITED_RANK, HOSTS, KILLED_RANK,
                                           LOST_DAEMON, SRUN, SRUN_NODE_FAILURE,
                                           SRUN_TASK_EXIT)


def test_a_lost_daemon_names_the_host_and_its_ranks():
  failure = failures.describe_failure(205, LOST_DAEMON.splitlines(), HOSTS,
                                      workers_per_host=2)
  assert failure.cause.startswith(
      'lost contact with host 10.0.0.2 (ranks 2, 3): it went down')
  assert failure.retry and failure.exit_code == 205


def test_a_killed_rank_names_rank_host_and_signal():
  failure = failures.describe_failure(137, KILLED_RANK.splitlines(), HOSTS,
                                      workers_per_host=2)
  assert failure.cause == 'rank 3 on host 10.0.0.2 was killed by SIGKILL (9)'
  assert failure.retry


def test_workers_that_ended_themselves_name_the_one_they_waited_on():
  stuck = ("12:00:00 E worker {} : the job's collectives have not moved for "
           "{} s (the stuck-worker timeout, 10 x --failure_timeout): ...")
  lines = [stuck.format(0, 120).replace(' :', ':'),
           stuck.format(2, 121).replace(' :', ':'),
           'Peer host: h2', 'srun: error: h1: task 0: Exited with exit code 4']
  failure = failures.describe_failure(4, lines, ['h1', 'h2', 'h3'], 1)
  assert failure.cause == ('worker 1 was frozen or stuck: the others waited '
                           "121 s on the job's collectives, then ended "
                           'themselves')
  assert failure.retry and failure.first_exit_code == 4
  # On this host the launcher does not know the worker count.
  assert failures.describe_failure(4, lines[:1], [], 2).cause.startswith(
      'a worker was frozen or stuck: the others waited 120 s')


@pytest.mark.parametrize('code,retry,meaning', [
    (2, False, 'a usage error'), (3, False, 'a non-finite loss'),
    (4, True, 'it waited too long on a frozen or stuck worker'),
    (143, True, 'SIGTERM (15)'), (1, True, None)])
def test_a_rank_exit_code_decides_whether_to_retry(code, retry, meaning):
  failure = failures.describe_failure(
      code, EXITED_RANK.format(code=code).splitlines(), HOSTS, 1)
  assert failure.cause.startswith(f'rank 1 exited with code {code}')
  assert failure.retry is retry
  if meaning:
    assert meaning in failure.cause


def test_without_mpirun_output_the_exit_code_is_the_cause():
  assert failures.describe_failure(2, [], [], 1) == failures.Failure(
      2, 'the job exited with code 2 (a usage error: see its error line '
      'above)', retry=False)
  assert failures.describe_failure(137, [], [], 1).retry


def test_srun_names_the_lost_node_and_the_first_task_to_exit():
  nodes = ['s1', 's2', 's3']
  lost = failures.describe_failure(137, SRUN_NODE_FAILURE.splitlines(),
                                   nodes, 1, SRUN)
  assert lost.cause.startswith('Slurm lost node s3 (rank 2): it went down')
  assert lost.retry
  first = failures.describe_failure(143, SRUN_TASK_EXIT.splitlines(),
                                    nodes, 1, SRUN)
  assert first.cause == 'rank 1 on host s2 exited with code 138 (SIGUSR1 (10))'
  assert first.first_exit_code == 138
  # srun's words are the Slurm placement's to read, not the supervisor's.
  assert failures.describe_failure(
      143, SRUN_TASK_EXIT.splitlines(), nodes, 1).cause == (
          'the job exited with code 143 (SIGTERM (15))')
  # A task a signal ended: srun says the signal's name, the first first (a
  # rank's crash in MPI's start-up, the others ended by srun after it).
  crashed = failures.describe_failure(143, [
      'srun: error: s1: task 0: Segmentation fault',
      'srun: launch/slurm: _step_signal: Terminating StepId=10.0',
      'srun: error: s2: task 1: Terminated',
      'srun: error: s3: task 2: Terminated'], nodes, 1, SRUN)
  assert crashed.cause == ('rank 0 on host s1 exited with code 139 '
                           '(SIGSEGV (11))')
  assert crashed.retry


def test_a_host_whose_processes_died_is_named():
  # Which of these mpirun prints depends on what noticed first.
  closed = ['Connection to 10.0.0.2 closed by remote host.',
            'ORTE was unable to reliably start one or more daemons.']
  peer = ['An MPI communication peer process has unexpectedly disconnected.',
          '  Local host: h1', '  Local PID:  18996',
          '  Peer host:  10.0.0.2']
  for output in (closed, peer):
    failure = failures.describe_failure(255, output, HOSTS, 1)
    assert failure.cause.startswith('lost contact with host 10.0.0.2 '
                                    '(rank 1)'), failure
    assert failure.retry
  # 255 is mpirun's own failure, not a signal.
  assert 'signal' not in failures.describe_failure(255, [], [], 1).cause
