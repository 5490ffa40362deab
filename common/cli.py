"""How entry points report bad input (one line, non-zero exit, no traceback)
and what their logs show."""

import errno
import inspect
import logging as py_logging
import os
import sys

from absl import app
from absl import flags
from absl import logging

from common import interrupts
from common.errors import RunStopped, UsageError


def fail(message: str, exit_code: int = UsageError.exit_code) -> None:
  try:
    print(f'error: {message}', file=sys.stderr, flush=True)
  except OSError:
    pass  # A terminal that closed (SIGHUP): the exit code still tells.
  sys.exit(exit_code)


# Entry points import this module before TensorFlow: a Ctrl-C from here on
# is one line (common/interrupts.py), also before run_main.
interrupts.install()


_HELP_FLAGS = ('-h', '-?', '--help', '-help', '--helpfull', '-helpfull',
               '--helpshort', '-helpshort')


def parse_flags_or_fail(argv):
  """absl flag parser for app.run that reports a bad flag in one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f'{e} (see --helpfull)')
  except SystemExit:
    # absl prints the help and exits 1; asking for help is not an error.
    if any(arg in _HELP_FLAGS for arg in argv[1:]):
      sys.exit(0)
    raise


def _is_disk_full(error: Exception) -> bool:
  # TensorFlow reports a failed write as an OpError whose text carries
  # strerror(ENOSPC); Python as an OSError with that errno.
  return (getattr(error, 'errno', None) == errno.ENOSPC or
          'No space left on device' in str(error))


def run_main(main, argv):
  """Runs `main(argv)`, turning our errors into the one-line report."""
  try:
    return main(argv)
  except (UsageError, RunStopped) as e:
    fail(str(e), e.exit_code)
  except KeyboardInterrupt:
    fail(interrupts.MESSAGE, interrupts.EXIT_CODE)
  except Exception as e:  # pylint: disable=broad-except
    if interrupts.happened():  # A Ctrl-C another exception carried on.
      fail(interrupts.MESSAGE, interrupts.EXIT_CODE)
    if not _is_disk_full(e):
      raise
    fail('no space left on the device of --model_dir (or of the export); '
         'free space or use another --model_dir and rerun to resume: '
         'checkpoints and exports written earlier are intact')


def define_main_flags(define_flags) -> None:
  """`define_flags()` (or `define_flags(FLAGS)`), its flags made key flags of
  the main module: --help lists the main module's, and under a console
  script that is the script, not the module that defined them."""
  before = set(flags.FLAGS)
  if inspect.signature(define_flags).parameters:
    define_flags(flags.FLAGS)
  else:
    define_flags()
  for name in set(flags.FLAGS) - before:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def run_entry_point(main, define_flags=None) -> None:
  """What every entry point's command line does: its flags defined in
  absl's FLAGS (define_main_flags), parsed (a bad one is one line) and
  `main` run (our errors are one line)."""
  if define_flags:
    define_main_flags(define_flags)
  app.run(lambda argv: run_main(main, argv), flags_parser=parse_flags_or_fail)


def log_formatter() -> py_logging.Formatter:
  """Readable lines: time, level letter, message (absl's prefix is noisy)."""
  return py_logging.Formatter('%(asctime)s %(levelname).1s %(message)s',
                              datefmt='%H:%M:%S')


# TensorFlow's and orbit's INFO lines that tell a user of these programs
# nothing: three per checkpoint (its sharding callback's duration, the
# background write's start, the wait for it; our line says both), three
# per export (captures renamed inside the SavedModel, its fingerprint file),
# one per evaluation (the data's end, which the evaluation line gives as its
# example count) and the background writer's set-up and end, the last
# after a run's last line. Warnings with the same text still show.
_NOISE = ('Sharding callback duration', 'contains input name(s) resource',
          'Writing fingerprint to', 'The dataset iterator is exhausted',
          'Starting async checkpoint save', 'Sync on ongoing save/restore',
          "Initializing async checkpoint's save_counter",
          'Joining the async save thread',
          'Async save thread reached the end')


class _DropNoise(py_logging.Filter):

  def filter(self, record: py_logging.LogRecord) -> bool:
    if record.levelno > py_logging.INFO:
      return True
    message = record.getMessage()
    return not any(noise in message for noise in _NOISE)


def configure_logging() -> None:
  handler = logging.get_absl_handler()
  handler.setFormatter(log_formatter())
  if not any(isinstance(f, _DropNoise) for f in handler.filters):
    handler.addFilter(_DropNoise())


def define_model_dir_flag(values: flags.FlagValues) -> None:
  """--model_dir, required, of the tools that read a training run."""
  flags.DEFINE_string('model_dir', None,
                      'Directory of a training run: its config.json and '
                      'checkpoints.', flag_values=values)
  flags.mark_flag_as_required('model_dir', flag_values=values)


def start_tool(argv, model_dir: str) -> str:
  """The start of a model_dir tool's main (validate, average, export): checks
  argv and model_dir, sets up logging; returns model_dir."""
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}; see --help')
  configure_logging()
  if not os.path.isdir(model_dir):
    raise UsageError(f'--model_dir={model_dir} is not a directory')
  return model_dir
