"""The tf.data service's servers (data_service.py), one per process.

  python -m resnet_keras.data.service dispatcher --port 5050 --work_dir /tmp/d
  python -m resnet_keras.data.service worker --dispatcher h2:5050 --port 5051

demo_resnet_keras.py --data_service_hosts starts them over ssh; a server
stops on SIGTERM or SIGINT.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import socket

import tensorflow as tf
from absl import flags

from common import cli
from common.errors import UsageError
from resnet_keras.data import data_service
# pylint: enable=g-import-not-at-top

ROLES = ('dispatcher', 'worker')


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


def main(argv):
  if len(argv) != 2 or argv[1] not in ROLES:
    raise UsageError('say which server to start: dispatcher or worker')
  port = flags.FLAGS.port
  try:
    if argv[1] == 'dispatcher':
      server = data_service.start_dispatcher(port, flags.FLAGS.work_dir)
      mode = (f'fault tolerant, work_dir {flags.FLAGS.work_dir}'
              if flags.FLAGS.work_dir else 'no work_dir: a restart forgets '
              'its jobs')
      address = f'{data_service.PROTOCOL}://{socket.gethostname()}:{port}'
      ready = f'tf.data service dispatcher ready at {address} ({mode})'
    else:
      server, config = data_service.start_worker(
          port, flags.FLAGS.dispatcher, flags.FLAGS.worker_address)
      ready = (f'tf.data service worker ready at {config.worker_address}, '
               f'serving {config.dispatcher_address}')
  except tf.errors.OpError as e:
    raise UsageError(f'the {argv[1]} did not start on port {port}: '
                     f'{" ".join(e.message.split())}') from None
  print(ready, flush=True)
  data_service.serve_until_signalled(server)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
