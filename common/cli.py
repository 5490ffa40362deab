"""How entry points report bad input: one line, non-zero exit, no traceback."""

import sys

from absl import flags

from resnet_keras.errors import UsageError

USAGE_EXIT_CODE = 2


def fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(USAGE_EXIT_CODE)


def parse_flags_or_fail(argv):
  """absl flag parser for app.run that reports a bad flag in one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f'{e} (see --helpfull)')


def run_main(main, argv):
  """Runs `main(argv)`, turning UsageError into the one-line report."""
  try:
    return main(argv)
  except UsageError as e:
    fail(str(e))
