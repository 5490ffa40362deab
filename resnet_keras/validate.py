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
import dataclasses
import os

from absl import flags

from common import cli
from common.errors import UsageError
from resnet_keras import checkpoints
from resnet_keras import scoring
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  flags.DEFINE_string('checkpoint', None,
                      'A checkpoint (a path, or a name in --model_dir such as '
                      'ckpt-4), or "all" for every checkpoint kept; default: '
                      'the latest.',
                      flag_values=values)
  flags.DEFINE_string('data_dir', None,
                      'Read the validation data here instead of the run\'s '
                      'data_dir (same --dataset format; real data even for a '
                      'synthetic-data run).',
                      flag_values=values)
  flags.DEFINE_boolean('eval_flip', None,
                       'Average each image\'s and its mirror\'s logits '
                       '(test-time flip augmentation), or not; default: as '
                       'the run evaluated (its --eval_flip).',
                       flag_values=values)
  flags.DEFINE_list('saved_model', None,
                    'Score these exports instead of checkpoints: SavedModel '
                    'directories, .onnx or .tflite files (comma-separated); '
                    'each compared with the first.',
                    flag_values=values)



def main(argv):
  model_dir = cli.start_tool(argv, flags.FLAGS.model_dir)
  cfg, plan = checkpoints.read_config(model_dir)
  if flags.FLAGS.data_dir:
    cfg = dataclasses.replace(cfg, data_dir=flags.FLAGS.data_dir,
                              use_synthetic_data=False)
  if flags.FLAGS.eval_flip is not None:
    cfg = dataclasses.replace(cfg, eval_flip=flags.FLAGS.eval_flip)
  if flags.FLAGS.saved_model:
    if flags.FLAGS.checkpoint:
      raise UsageError('--checkpoint scores checkpoints, --saved_model '
                       'exports: pass one of them')
    rows = scoring.score_exports(cfg, flags.FLAGS.saved_model)
    print(scoring.format_exports_table(rows))
    path = os.path.join(model_dir, scoring.EXPORTS_RESULTS_FILE)
    scoring.write_csv(path, rows, scoring.EXPORTS_COLUMNS)
  else:
    rows = scoring.evaluate_checkpoints(cfg, plan, flags.FLAGS.checkpoint)
    print(scoring.format_table(rows))
    path = os.path.join(model_dir, scoring.RESULTS_FILE)
    scoring.write_csv(path, rows)
  print(f'wrote {path}')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
