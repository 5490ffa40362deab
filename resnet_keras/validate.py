"""Evaluates a run's checkpoints, or its exports, on its validation data.

  python -m resnet_keras.validate --model_dir DIR                 # the latest
  python -m resnet_keras.validate --model_dir DIR --checkpoint all
  python -m resnet_keras.validate --model_dir DIR --checkpoint ckpt-4
  python -m resnet_keras.validate --model_dir DIR --data_dir /data/tf_records
  python -m resnet_keras.validate --model_dir DIR --eval_flip   # flip TTA
  python -m resnet_keras.validate --model_dir DIR \
      --saved_model DIR/saved_model,DIR/exports/ckpt-8/model_int8.tflite

The model and data flags come from DIR/config.json, which training writes
when it starts, so none are repeated; --data_dir reads other (or moved) data
of the run's --dataset format instead. Prints a table and writes
DIR/validation.csv (one row per checkpoint evaluated), or with --saved_model
DIR/validation_exports.csv (one row per export). How each is scored:
scoring.py.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
from absl import flags

from common import cli
from resnet_keras.rundir import ownership
from resnet_keras.tools import scoring
from resnet_keras.tools import tool_flags
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  tool_flags.define_checkpoint(values, 'score')
  tool_flags.define_data_dir(values, 'its validation images are scored')
  tool_flags.define_eval_flip(values, None)
  tool_flags.define_saved_model(
      values, 'Score these exports instead of checkpoints, each compared '
      'with the first', several=True)


def main(argv):
  values = flags.FLAGS
  cli.start_tool(argv, values.model_dir)
  cfg, plan = tool_flags.run_config(values)
  # It writes its scores into the run: the run's writer while it does.
  with ownership.take(values.model_dir, 'resnet_keras.validate',
                      new_run=False):
    table, path = scoring.validate(cfg, plan, values.checkpoint,
                                   values.saved_model)
  print(table)
  print(f'wrote {path}')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
