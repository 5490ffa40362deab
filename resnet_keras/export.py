"""Exports a run's checkpoints without retraining (serving/deployment.py).

  python -m resnet_keras.export --model_dir DIR                 # the latest
  python -m resnet_keras.export --model_dir DIR --checkpoint ckpt-4
  python -m resnet_keras.export --model_dir DIR --format onnx,tflite \\
      --quantize none,float16,dynamic,int8

Training with --enable_checkpoint_and_export writes DIR/saved_model, the
classifier, at its end. This command exports any checkpoint a run kept to
DIR/exports/<checkpoint>/ (--output_dir): the classifier in saved_model/ and
the pooled features without the head (2048 values per image for ResNet-50)
in feature_vector/, both Reusable SavedModels; --format onnx,tflite writes
model.onnx and model[_QUANTISATION].tflite beside them, each checked against
the network on the first validation images as it is written. What every
export takes and returns: serving/contract.py.
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
from resnet_keras.serving import contract
from resnet_keras.serving import deployment
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  flags.DEFINE_string('checkpoint', None,
                      'The checkpoint to export (a path, or a name in '
                      '--model_dir such as ckpt-4), or "all" for every '
                      'checkpoint kept; default: the latest.',
                      flag_values=values)
  flags.DEFINE_string('output_dir', None,
                      'Each checkpoint goes to OUTPUT_DIR/<checkpoint name>/'
                      '{saved_model,feature_vector,model.onnx,...}; default: '
                      'MODEL_DIR/exports.',
                      flag_values=values)
  flags.DEFINE_list('format', ['saved_model'],
                    'What to write, comma-separated: saved_model (the '
                    'classifier and the feature vector), onnx (model.onnx), '
                    'tflite (model[_QUANTIZE].tflite).',
                    flag_values=values)
  flags.DEFINE_list('quantize', ['none'],
                    'TFLite files to write, one per value: none (float32), '
                    'float16 (weights), dynamic (int8 weights), int8 (int8 '
                    'weights and activations, calibrated).',
                    flag_values=values)
  flags.DEFINE_integer('representative_images', 200,
                       '--quantize int8 calibrates its activation ranges on '
                       'this many training images.',
                       flag_values=values, lower_bound=1)
  flags.DEFINE_string('data_dir', None,
                      'Read the run\'s data here instead of its data_dir '
                      '(ONNX and TFLite exports are checked on its validation '
                      'images; int8 calibrates on its training images).',
                      flag_values=values)


def main(argv):
  model_dir = cli.start_tool(argv, flags.FLAGS.model_dir)
  cfg, _ = checkpoints.read_config(model_dir)
  if flags.FLAGS.data_dir:
    cfg = dataclasses.replace(cfg, data_dir=flags.FLAGS.data_dir,
                              use_synthetic_data=False)
  output_dir = flags.FLAGS.output_dir or os.path.join(model_dir,
                                                      contract.EXPORTS_DIR)
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise UsageError(f'--output_dir={output_dir} cannot be created '
                     f'({e.strerror}); choose a writable directory') from None
  for path in deployment.export_checkpoints(
      cfg, flags.FLAGS.checkpoint, output_dir, flags.FLAGS.format,
      flags.FLAGS.quantize, flags.FLAGS.representative_images):
    if os.path.isdir(path):
      print(f'exported {path}')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
