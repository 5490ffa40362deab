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
export takes and returns: serving/contract.py. The files it writes are
programs to whoever loads them, and it reads the run's checkpoints as
trusted input: export only runs you trust, and hand on only exports of them.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import os
import re

from absl import flags

from common import cli
from resnet_keras.rundir import ownership
from resnet_keras.rundir import run_directory
from resnet_keras.tools import tool_flags
from resnet_keras.serving import contract
from resnet_keras.serving import deployment
# pylint: enable=g-import-not-at-top


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  tool_flags.define_checkpoint(values, 'export')
  tool_flags.define_output_dir(
      values, 'each checkpoint (as OUTPUT_DIR/<checkpoint name>/'
      '{saved_model,feature_vector,model.onnx,...})', contract.EXPORTS_DIR)
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
  tool_flags.define_data_dir(
      values, 'ONNX and TFLite exports are checked on its validation '
      'images; int8 calibrates on its training images')


def main(argv):
  values = flags.FLAGS
  cli.start_tool(argv, values.model_dir)
  if values.output_dir:
    ownership.check_new_or_own(values.output_dir, '--output_dir',
                               _holds_exports_only)
  # The run's exports/ is the run's: its writer while it writes there.
  cfg, _ = tool_flags.run_config(values)
  with ownership.take(values.model_dir, 'resnet_keras.export',
                      new_run=False):
    for path in deployment.export_checkpoints(
        cfg, values.checkpoint, values.output_dir, values.format,
        values.quantize, values.representative_images):
      if os.path.isdir(path):  # ONNX and TFLite files say their own line.
        print(f'exported {path}')


def _holds_exports_only(output_dir: str) -> bool:
  """Whether output_dir holds only this tool's exports (a folder per
  checkpoint): an earlier --output_dir of it."""
  return all(re.fullmatch(rf'{run_directory.CHECKPOINT_PREFIX}-\d+', name) and
             os.path.isdir(os.path.join(output_dir, name))
             for name in os.listdir(output_dir))


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
