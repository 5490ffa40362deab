"""How entry points fail (one 'error:' line and an exit code, no traceback)
and what their logs leave out."""

import errno
import logging as py_logging

from absl import logging
import pytest

from common import cli
from common.errors import RunStopped, UsageError


def _exit(capsys, main, *argv):
  with pytest.raises(SystemExit) as exited:
    cli.run_main(main, ['prog', *argv])
  return exited.value.code, capsys.readouterr().err


def test_a_usage_error_is_one_line_and_exit_code_2(capsys):
  def main(argv):
    raise UsageError('--batch_size must be > 0, got 0')
  code, err = _exit(capsys, main)
  assert code == UsageError.exit_code
  assert err == 'error: --batch_size must be > 0, got 0\n'


def test_a_stopped_run_exits_with_its_own_code(capsys):
  def main(argv):
    raise RunStopped('stopped by SIGTERM at step 3', 143)
  code, err = _exit(capsys, main)
  assert code == 143 and err.startswith('error: stopped by SIGTERM')


def test_a_full_disk_is_reported_as_such(capsys):
  def main(argv):
    raise OSError(errno.ENOSPC, 'No space left on device')
  code, err = _exit(capsys, main)
  assert code == UsageError.exit_code and 'no space left' in err


def test_other_errors_keep_their_traceback():
  def main(argv):
    raise KeyError('bug')
  with pytest.raises(KeyError):
    cli.run_main(main, ['prog'])


def test_a_normal_return_passes_through():
  assert cli.run_main(lambda argv: argv[1:], ['prog', 'x']) == ['x']


def test_start_tool_checks_arguments_and_model_dir(tmp_path):
  assert cli.start_tool(['prog'], str(tmp_path)) == str(tmp_path)
  with pytest.raises(UsageError, match='unexpected arguments'):
    cli.start_tool(['prog', 'extra'], str(tmp_path))
  with pytest.raises(UsageError, match='is not a directory'):
    cli.start_tool(['prog'], str(tmp_path / 'missing'))


def test_tensorflows_routine_info_lines_are_dropped_not_its_warnings():
  cli.configure_logging()
  cli.configure_logging()  # Entry points called again in one process.
  handler = logging.get_absl_handler()
  assert sum(isinstance(f, cli._DropNoise) for f in handler.filters) == 1

  def shown(level, message):
    record = py_logging.LogRecord('tensorflow', level, __file__, 1, message,
                                  (), None)
    return bool(handler.filter(record))

  for noise in ('Sharding callback duration: 49 microseconds',
                'Function `serve` contains input name(s) resource with '
                'unsupported characters which will be renamed to x',
                'Writing fingerprint to /m/saved_model.partial/fingerprint.pb',
                'The dataset iterator is exhausted after 2 steps.',
                'Starting async checkpoint save on the device: /job:localhost'
                '/replica:0/task:0/device:CPU:0',
                'Sync on ongoing save/restore.',
                "Initializing async checkpoint's save_counter: 0",
                'Joining the async save thread.',
                'Async save thread reached the end of the execution.'):
    assert not shown(py_logging.INFO, noise), noise
    assert shown(py_logging.WARNING, noise), noise
  assert shown(py_logging.INFO, 'saved checkpoint at step 4 (/m/ckpt-4): '
               'training blocked 0.01 s, written in 0.02 s in the background')
  assert shown(py_logging.INFO, 'exported SavedModel to /m/saved_model')
