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
import os

from absl import flags

from common import cli
from resnet_keras import checkpoint_average
from resnet_keras import checkpoints
from resnet_keras import scoring
from resnet_keras.serving import saved_model
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
  flags.DEFINE_string('output_dir', None,
                      'Where the averaged checkpoint goes; default: '
                      'MODEL_DIR/averaged.',
                      flag_values=values)
  flags.DEFINE_boolean('export', False,
                       'Also export it as a SavedModel to '
                       'OUTPUT_DIR/saved_model.',
                       flag_values=values)


def main(argv):
  model_dir = cli.start_tool(argv, flags.FLAGS.model_dir)
  ema_decay = flags.FLAGS.ema
  checkpoint_average.check_ema_decay(ema_decay)
  output_dir = checkpoint_average.output_dir_for(model_dir,
                                                flags.FLAGS.output_dir)
  cfg, plan = checkpoints.read_config(model_dir)
  evaluator = scoring.CheckpointEvaluator(cfg, plan)
  paths = checkpoint_average.select_last(
      checkpoints.checkpoint_paths(evaluator.manager, model_dir, 'all'),
      flags.FLAGS.last, model_dir)
  averaged = checkpoint_average.write_averaged(evaluator, paths, ema_decay,
                                              output_dir)
  method = checkpoint_average.describe_method(paths, ema_decay)
  print(f'wrote {averaged}: {method}')
  if flags.FLAGS.export:  # The model holds the average until evaluated.
    path, = saved_model.export_run(evaluator.network, cfg, output_dir)
    print(f'exported {path}')
  rows = [evaluator.evaluate(paths[-1]), evaluator.evaluate(averaged)]
  rows[1]['checkpoint'] = os.path.relpath(averaged, model_dir)
  print(scoring.format_table(rows))
  scoring.write_csv(os.path.join(output_dir, scoring.RESULTS_FILE), rows)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
