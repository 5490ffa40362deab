"""Top-5 classes of image files, from an export: a SavedModel, ONNX or TFLite.

  python -m resnet_keras.predict --saved_model DIR/saved_model cat.jpg photos/
  python -m resnet_keras.predict --saved_model DIR/saved_model --labels L img.png
  python -m resnet_keras.predict --saved_model DIR/exports/ckpt-8/model.onnx x.jpg

Images are JPEG or PNG files of any size, colour or grayscale; a folder
stands for its .jpg, .jpeg and .png files, sorted. They are preprocessed
exactly as the run's evaluation did (aspect-preserving resize, central crop
of the run's --eval_crop_fraction): by the SavedModel's `serving_encoded`
signature, or for an ONNX or TFLite file from what it records
(serving/readers.py). Classes are named from --labels, else from the
labels.txt the export took from the training data, else shown as class
indices. For each image: its path, then its 5 most likely classes, one
per line, as probability and name. --eval_flip averages each image's and its
mirror's logits (test-time flip augmentation, as evaluation's --eval_flip).
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import os
from typing import List, Optional

import numpy as np
import tensorflow as tf
from absl import flags

from common import cli
from resnet_keras.serving import readers
from resnet_keras.data import imagenet
from common.errors import UsageError
# pylint: enable=g-import-not-at-top

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png')
TOP_K = 5


def define_flags(values: flags.FlagValues) -> None:
  flags.DEFINE_string('saved_model', None,
                      'SavedModel directory (model_dir/saved_model of a run '
                      'with --enable_checkpoint_and_export), or an .onnx or '
                      '.tflite file (python -m resnet_keras.export --format).',
                      flag_values=values)
  flags.DEFINE_string('labels', None,
                      'Class names, one per line in label order (the '
                      'converter\'s labels.txt); default: the one exported '
                      'with the model, else class indices.',
                      flag_values=values)
  flags.DEFINE_boolean('eval_flip', False,
                       'Average each image\'s and its mirror\'s logits, as '
                       'evaluation does with --eval_flip.',
                       flag_values=values)
  flags.mark_flag_as_required('saved_model', flag_values=values)


def image_files(args: List[str]) -> List[str]:
  """The files `args` name, folders expanded to their images."""
  if not args:
    raise UsageError('pass one or more image files or folders after the flags')
  files = []
  for arg in args:
    if os.path.isdir(arg):
      found = sorted(os.path.join(arg, name) for name in os.listdir(arg)
                     if name.lower().endswith(IMAGE_SUFFIXES))
      if not found:
        raise UsageError(f'{arg} has no .jpg, .jpeg or .png files')
      files.extend(found)
    elif os.path.isfile(arg):
      files.append(arg)
    else:
      raise UsageError(f'{arg} does not exist')
  return files


def class_names(labels: List[str], labels_file: Optional[str],
                num_classes: int) -> List[str]:
  """A name per model output: --labels, the exported `labels`, or indices."""
  if labels_file:
    if not os.path.isfile(labels_file):
      raise UsageError(f'--labels={labels_file} does not exist')
    labels = imagenet.read_labels(labels_file)
  if len(labels) > num_classes:
    raise UsageError(f'{labels_file or "the export"} names {len(labels)} '
                     f'classes but the model has {num_classes}; pass its '
                     'training data\'s labels.txt with --labels')
  # A model may have more outputs than its data had classes (--num_classes).
  return list(labels) + [f'class {i}' for i in range(len(labels), num_classes)]


def main(argv):
  files = image_files(argv[1:])
  model = readers.load(flags.FLAGS.saved_model)
  names = class_names(model.labels, flags.FLAGS.labels, model.num_classes)
  for path in files:
    with open(path, 'rb') as f:
      encoded = f.read()
    try:  # One image per call, so an undecodable file is named.
      probabilities = readers.probabilities_of(model, encoded,
                                               flags.FLAGS.eval_flip)
    except tf.errors.InvalidArgumentError:
      raise UsageError(f'{path} is not a JPEG or PNG image') from None
    print(path)
    for i in np.argsort(-probabilities, kind='stable')[:TOP_K]:
      print(f'  {probabilities[i]:.4f}  {names[i]}')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
