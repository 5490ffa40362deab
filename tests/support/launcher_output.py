"""What mpirun and srun print when a job fails, as the launcher's tests
read it (tests/unit/test_failures.py, test_supervisor.py)."""

from resnet_keras.launcher import slurm

HOSTS = ['10.0.0.1', '10.0.0.2']

LOST_DAEMON = '''\
--------------------------------------------------------------------------
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[36023,0],0] on node h1
  Remote daemon: [[36023,0],1] on node 10.0.0.2

This is usually due to either a failure of the TCP network
--------------------------------------------------------------------------'''

KILLED_RANK = '''\
--------------------------------------------------------------------------
mpirun noticed that process rank 3 with PID 0 on node 10.0.0.2 exited on signal 9 (Killed).
--------------------------------------------------------------------------'''

EXITED_RANK = '''\
[1,1]<stderr>:error: --data_dir=/x does not exist
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[63015,1],1]
  Exit code:    {code}
--------------------------------------------------------------------------'''


# srun's account of a step whose node failed, and of one whose task 1
# exited first (the others ended by --kill-on-bad-exit), as Slurm 22.05
# prints them.
SRUN_NODE_FAILURE = '''\
srun: error: Node failure on s3
srun: error: s1: task 0: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2.0
srun: error: s2: task 1: Killed'''
SRUN_TASK_EXIT = '''\
error: stopped by SIGUSR1 at step 7; rerun the same command to resume
srun: error: s2: task 1: Exited with exit code 138
srun: launch/slurm: _step_signal: Terminating StepId=2.0
srun: error: s1: task 0: Terminated'''
SRUN = slurm.SrunOutput()

# What mpirun prints when it begins to take a job down.
ABORT_NOTICES = {'aborted': 'Per user-direction, the job has been aborted.',
                 'killed_rank': KILLED_RANK, 'lost_daemon': LOST_DAEMON}
