"""Ctrl-C in one line, wherever it lands: also before a program's own
handling begins (its imports, its set-up) and where an extension turns
the KeyboardInterrupt into another exception (TensorFlow's C++ modules,
interrupted while they load, raise "ImportError: initialization
failed"). Standard library only: entry points install it before their
other imports.

`install` keeps Python's behaviour (SIGINT raises KeyboardInterrupt) and
adds a note that it happened; an exception that reaches the top of the
program (sys.excepthook) or cli.run_main after a Ctrl-C is reported as
the interrupt, in one line, exit 130. A SIGINT that is ignored (a
background job's) or handled by someone else is left alone.

`hold_warning` (the trainer's): the warning signal (a scheduler's, or the
launcher's when a dropped host rejoins the job) is held from the process's
start until the trainer's guards take it over (resnet_keras/guards.py),
which then save at the first step boundary and stop. Its default action
would end a worker still importing or setting up, the job with it.
"""

import os
import signal
import sys

from common.errors import WARNING_SIGNAL

# Every write of the package is atomic (resnet_keras/files.py, TensorFlow's
# checkpoints): what was written before is whole, or was not written.
MESSAGE = ('interrupted by Ctrl-C (SIGINT); what was written before is '
           'kept: rerun the same command to go on')
EXIT_CODE = 128 + signal.SIGINT

_interrupted = False
_installed = False
_warned = False


def happened() -> bool:
  """Whether a Ctrl-C arrived through this module's handler."""
  return _interrupted


def _on_ctrl_c(signum, frame):
  global _interrupted
  _interrupted = True
  signal.default_int_handler(signum, frame)


def _excepthook(kind, value, traceback):
  if not (issubclass(kind, KeyboardInterrupt) or _interrupted):
    _previous_excepthook(kind, value, traceback)
    return
  try:
    print(f'error: {MESSAGE}', file=sys.stderr, flush=True)
  except OSError:
    pass
  # Python would otherwise end by SIGINT itself (-2) after the hook, where
  # every other Ctrl-C exit of the package is 130.
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


_previous_excepthook = sys.excepthook


def install() -> None:
  """The handler and the report (once; only in the main thread)."""
  global _installed
  if _installed:
    return
  try:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      signal.signal(signal.SIGINT, _on_ctrl_c)
  except ValueError:
    return  # Not the main thread: signals are not this thread's.
  sys.excepthook = _excepthook
  _installed = True


def _on_warning(signum, frame):
  del signum, frame
  global _warned
  _warned = True


def hold_warning() -> None:
  """Holds the warning signal until `take_warning` takes it (main thread;
  one ignored stays ignored)."""
  if signal.getsignal(WARNING_SIGNAL) == signal.SIG_DFL:
    signal.signal(WARNING_SIGNAL, _on_warning)


def take_warning() -> bool:
  """Whether the warning arrived while it was held (once: the guard that
  asks takes it over)."""
  global _warned
  warned, _warned = _warned, False
  return warned
