"""Exceptions that end a run with one line instead of a traceback.

Entry points catch these (common/cli.py), print the message as a single line
and exit with the exception's status. Messages name what to fix (the flag,
the file, the allowed values), not what went wrong inside the program.
"""

import signal


class UsageError(Exception):
  """A problem with the user's input (flags, files, directories); exit 2."""
  exit_code = 2


# A run stopped by a non-finite loss or weight (guards.py); the launcher
# never retries it.
NON_FINITE_EXIT_CODE = 3

# A worker that ended itself after the job's collectives waited too long for
# a frozen or stuck worker (resnet_keras/training/watchdog.py); the launcher
# restarts the job.
STUCK_EXIT_CODE = 4

# A scheduler's warning before it takes the nodes (Slurm's --signal, sent
# ahead of a time limit or a preemption): the workers save at the next
# step and exit with the shell's code for it, which tells the launcher the
# job is to be resumed elsewhere, not restarted where it is.
WARNING_SIGNAL = signal.SIGUSR1
STOPPED_AT_WARNING_EXIT_CODE = 128 + WARNING_SIGNAL


class RunStopped(Exception):
  """Training stopped early on purpose (a signal, a non-finite loss).

  Whatever could be saved was saved before this is raised.
  """

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code
