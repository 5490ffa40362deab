"""Averages a run's last checkpoints into a new checkpoint, and scores it.

  python -m resnet_keras.average --model_dir DIR                # all kept
  python -m resnet_keras.average --model_dir DIR --last 3       # mean of 3
  python -m resnet_keras.average --model_dir DIR --ema 0.9      # EMA
  python -m resnet_keras.average --model_dir DIR --last 3 --export

Every variable of the model is averaged, batch-norm moving statistics
included, over the checkpoints DIR keeps, in step order: their mean, or with
--ema DECAY the exponential moving average over the checkpoints (oldest
first; not the training-time average of --ema_decay, which a run's
checkpoints hold and this averages). How: checkpoint_average.py.

It goes to DIR/averaged/ (--output_dir), with a copy of DIR/config.json and
averaging.json (method and source checkpoints): a directory of its own, so
training in DIR never resumes from it, while validate, --restore_from and
--pretrained_checkpoint take it like a run's model_dir. --export adds
DIR/averaged/saved_model (the training export, for predict). The averaged
and the last checkpoint are scored with validate's evaluation, side by side.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
from absl import flags

from common import cli
from resnet_keras.tools import checkpoint_average
from resnet_keras.tools import tool_flags
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  flags.DEFINE_integer('last', None,
                       'Average the last N checkpoints kept; default: all.',
                       flag_values=values)
  flags.DEFINE_float('ema', None,
                     'Exponential moving average with this decay in (0, 1) '
                     'over the checkpoints, oldest first, instead of the '
                     'mean.',
                     flag_values=values)
  tool_flags.define_output_dir(values, 'the averaged checkpoint',
                               checkpoint_average.OUTPUT_DIR)
  flags.DEFINE_boolean('export', False,
                       'Also export it as a SavedModel to '
                       'OUTPUT_DIR/saved_model.',
                       flag_values=values)


def main(argv):
  values = flags.FLAGS
  model_dir = cli.start_tool(argv, values.model_dir)
  checkpoint_average.average_run(model_dir, values.last, values.ema,
                                 values.output_dir, values.export)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
