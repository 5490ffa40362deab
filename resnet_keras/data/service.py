"""The tf.data service's servers (input_service.py), one per process.

  python -m resnet_keras.data.service dispatcher --port 5050 --work_dir /tmp/d
  python -m resnet_keras.data.service worker --dispatcher h2:5050 --port 5051

demo_resnet_keras.py --data_service_hosts starts them over ssh; a server
stops on SIGTERM or SIGINT.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import os

from absl import flags

from common import cli
from common.errors import UsageError
from resnet_keras.files import kind_of
from resnet_keras.data import input_service
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  flags.DEFINE_integer('port', None, 'The port to serve on.',
                       flag_values=values, lower_bound=1, upper_bound=65535)
  flags.DEFINE_string('work_dir', None,
                      'dispatcher: where it journals its jobs, so that one '
                      'restarted with the same work_dir resumes them '
                      '(fault-tolerant mode); default: none, a restart '
                      'forgets them and the trainers must restart too.',
                      flag_values=values)
  flags.DEFINE_string('dispatcher', None,
                      'worker: the dispatcher, HOST:PORT or grpc://HOST:PORT.',
                      flag_values=values)
  flags.DEFINE_string('worker_address', None,
                      'worker: HOST:PORT at which trainers reach it; '
                      'default: this host\'s address toward the dispatcher, '
                      'and --port.',
                      flag_values=values)
  flags.mark_flag_as_required('port', flag_values=values)


def _make_work_dir(work_dir: str) -> None:
  """--work_dir as a directory, or one line saying why it cannot be one
  (TensorFlow's dispatcher would fail on it with a traceback)."""
  if os.path.exists(work_dir) and not os.path.isdir(work_dir):
    raise UsageError(f'--work_dir={work_dir} {kind_of(work_dir)}; give a '
                     'directory for the dispatcher\'s journal (made if '
                     'absent)')
  try:
    os.makedirs(work_dir, exist_ok=True)
  except OSError as e:
    raise UsageError(f'--work_dir={work_dir} cannot be made ({e.strerror}); '
                     'give a directory the dispatcher can write') from None


def main(argv):
  if len(argv) != 2 or argv[1] not in input_service.ROLES:
    raise UsageError('say which server to start: dispatcher or worker')
  values = flags.FLAGS
  if values.work_dir:
    _make_work_dir(values.work_dir)
  server, ready = input_service.start_server(
      argv[1], values.port, values.work_dir, values.dispatcher,
      values.worker_address)
  print(ready, flush=True)
  input_service.serve_until_signalled(server)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
