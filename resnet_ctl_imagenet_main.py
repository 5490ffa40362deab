"""Trains a ResNet image classifier with a custom training loop (orbit).

  python resnet_ctl_imagenet_main.py --use_synthetic_data -bs 32 -dt bf16
  python resnet_ctl_imagenet_main.py --config fashion_mnist_fast \\
      --data_dir /tmp/fmnist/tfrecords              # a recipe, resnet_keras/configs/
  python resnet_ctl_imagenet_main.py --helpfull      # every flag

Flags -> RunConfig (resnet_keras/config/flags.py) -> run
(resnet_keras/training/run.py).
"""

import os
import time

from common import interrupts

interrupts.install()  # First: a Ctrl-C in the imports below is one line.
interrupts.hold_warning()  # A warning during them is acted on, not fatal.

from common import env  # pylint: disable=g-import-not-at-top

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

from absl import flags  # pylint: disable=g-import-not-at-top

from common import cli  # pylint: disable=g-import-not-at-top
from common import worker_contract  # pylint: disable=g-import-not-at-top
from resnet_keras.config import flags as flags_lib  # pylint: disable=g-import-not-at-top
from resnet_keras.config import recipes  # pylint: disable=g-import-not-at-top
from resnet_keras.config.flags import define_flags  # pylint: disable=g-import-not-at-top
from resnet_keras.launcher import launch_config  # pylint: disable=g-import-not-at-top


def main(argv):
  started = time.time()  # TensorFlow's start-up is the run's too.
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; flags take the form --name=value')
  cli.configure_logging()
  flags_lib.apply_config(flags.FLAGS,
                         launcher_keys=launch_config.RECIPE_KEYS)
  # Bad values fail before TensorFlow loads.
  cfg = flags_lib.config_from_flags(flags.FLAGS)
  if flags.FLAGS.print_config:
    print(recipes.dump(cfg), end='')
    return
  worker_contract.check_environment(os.environ)
  from resnet_keras.training import run  # pylint: disable=g-import-not-at-top
  run.run(cfg, started)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
