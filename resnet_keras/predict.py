"""Top-5 classes of image files, from an export: a SavedModel, ONNX or TFLite.

  python -m resnet_keras.predict --saved_model DIR/saved_model cat.jpg photos/
  python -m resnet_keras.predict --saved_model DIR/saved_model --labels L img.png
  python -m resnet_keras.predict --saved_model DIR/exports/ckpt-8/model.onnx x.jpg

Images are JPEG or PNG files of any size, colour or grayscale; a folder
stands for its .jpg, .jpeg and .png files, sorted (only regular files: a
FIFO or device named like an image is skipped with a line). They are preprocessed
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
from typing import List

from absl import flags
from absl import logging

from common import cli
from common.errors import UsageError
from resnet_keras.files import kind_of
from resnet_keras.tools import tool_flags
from resnet_keras.serving import readers
# pylint: enable=g-import-not-at-top

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png')
TOP_K = 5


def define_flags(values: flags.FlagValues) -> None:
  tool_flags.define_saved_model(values, 'The export to predict with')
  flags.DEFINE_string('labels', None,
                      'Class names, one per line in label order (the '
                      'converter\'s labels.txt); default: the one exported '
                      'with the model, else class indices.',
                      flag_values=values)
  tool_flags.define_eval_flip(values, False)


def image_files(args: List[str]) -> List[str]:
  """The files `args` name, folders expanded to their images. Only regular
  files are read: a FIFO or device named like an image would block the
  read or never end; one named in a folder is skipped with a line."""
  if not args:
    raise UsageError('pass one or more image files or folders after the flags')
  files = []
  for arg in args:
    if os.path.isdir(arg):
      found = []
      for name in sorted(os.listdir(arg)):
        path = os.path.join(arg, name)
        if not name.lower().endswith(IMAGE_SUFFIXES):
          continue
        if os.path.isfile(path):
          found.append(path)
        else:
          logging.warning('skipping %s: it %s, not an image file', path,
                          kind_of(path))
      if not found:
        raise UsageError(f'{arg} has no .jpg, .jpeg or .png files')
      files.extend(found)
    elif os.path.isfile(arg):
      files.append(arg)
    else:
      raise UsageError(f'{arg} {kind_of(arg)}; pass image files or folders '
                       'of them')
  return files


def main(argv):
  values = flags.FLAGS
  files = image_files(argv[1:])
  for path, top in readers.top_classes(values.saved_model, files,
                                       values.labels, values.eval_flip,
                                       TOP_K):
    print(path)
    for probability, name in top:
      print(f'  {probability:.4f}  {name}')


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
