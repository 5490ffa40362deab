"""How entry points report bad input: one line, non-zero exit, no traceback."""

import errno
import logging as py_logging
import os
import sys

from absl import flags
from absl import logging

from common.errors import RunStopped, UsageError


def fail(message: str, exit_code: int = UsageError.exit_code) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(exit_code)


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
  except Exception as e:  # pylint: disable=broad-except
    if not _is_disk_full(e):
      raise
    fail('no space left on the device of --model_dir (or of the export); '
         'free space or use another --model_dir and rerun to resume: '
         'checkpoints and exports written earlier are intact')


def configure_logging() -> None:
  """Readable lines: time, level letter, message (absl's prefix is noisy)."""
  handler = logging.get_absl_handler()
  handler.setFormatter(py_logging.Formatter(
      '%(asctime)s %(levelname).1s %(message)s', datefmt='%H:%M:%S'))


def define_model_dir_flag() -> None:
  """--model_dir, required, of the tools that read a training run."""
  flags.DEFINE_string('model_dir', None,
                      'Directory of a training run: its config.json and '
                      'checkpoints.')
  flags.mark_flag_as_required('model_dir')


def start_tool(argv, model_dir: str) -> str:
  """The start of a model_dir tool's main (validate, average, export): checks
  argv and model_dir, sets up logging; returns model_dir."""
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}; see --help')
  configure_logging()
  if not os.path.isdir(model_dir):
    raise UsageError(f'--model_dir={model_dir} is not a directory')
  return model_dir
