"""Converts a raw ImageNet-style JPEG tree into the standard ImageNet TFRecords.

Input (--raw_data_dir R):
  R/train/<synset>/*.JPEG              one folder per class
  R/validation/*.JPEG                  with R/synset_labels.txt (one synset per
                                       image, in sorted filename order), or
  R/validation/<synset>/*.JPEG         class folders, when there is no
                                       synset_labels.txt
R/img_train and R/img_val (where the reference's extraction steps untar
ImageNet) are read in place of R/train and R/validation. Image files may end
in .JPEG, .jpg, .jpeg or .png (any case).

Output (--local_scratch_dir OUT):
  OUT/train/train-00000-of-01024 ...           shuffled with a fixed seed
  OUT/validation/validation-00000-of-00128 ... in sorted order
  OUT/labels.txt      line k is the synset of label k + 1 (labels are 1-based)
  OUT/metadata.json   num_classes, num_examples per split, image_format

Every image is decoded. RGB JPEGs are stored byte-for-byte; anything else
(PNG, CMYK or grayscale JPEG, whatever the file name says) is re-encoded as an
RGB JPEG. Each shard is written under a hidden temporary name and renamed when
complete, so a rerun after an interruption redoes only the missing shards.

Usage:
  python preprocess_imagenet.py --raw_data_dir R --local_scratch_dir OUT
      [--train_shards 1024] [--validation_shards 128] [--num_workers N]
      [--skip_bad_images]

The reference's `--nogcs_upload` is accepted (and changes nothing); uploading
is left to `gsutil -m cp -r OUT gs://...`.
"""

import os
import sys

from absl import app, flags

from common import cli
from common import env
from common import interrupts
from common.errors import RunStopped, UsageError
from resnet_keras.data import imagenet_converter

# The converter's worker processes inherit this environment. TensorFlow's
# C++ start-up notices (no GPU, oneDNN, CPU features) would bury the
# one-line errors on stderr.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
env.prepare_tensorflow_environment()  # oneDNN as in every entry point.


def define_flags(values: flags.FlagValues) -> None:
  flags.DEFINE_string('raw_data_dir', None,
                      'Directory holding train/ (or img_train/), validation/ '
                      '(or img_val/) and, for flat validation images, '
                      'synset_labels.txt.', flag_values=values)
  flags.DEFINE_string('local_scratch_dir', None,
                      'Output directory for train/, validation/, labels.txt '
                      'and metadata.json.', flag_values=values)
  flags.DEFINE_integer('train_shards', 1024, 'Number of training shards.',
                       flag_values=values)
  flags.DEFINE_integer('validation_shards', 128, 'Number of validation shards.',
                       flag_values=values)
  flags.DEFINE_integer('num_workers', os.cpu_count() or 1,
                       'Worker processes; each one writes whole shards.',
                       flag_values=values)
  flags.DEFINE_boolean('skip_bad_images', False,
                       'Skip (and report) files that cannot be decoded instead '
                       'of stopping at the first one.', flag_values=values)
  flags.DEFINE_boolean('gcs_upload', False,
                       'Accepted so that the reference command line '
                       '(--nogcs_upload) runs unchanged; uploading to GCS is '
                       'not built in: copy OUT with gsutil.',
                       flag_values=values)


def main(argv):
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {" ".join(argv[1:])}; all '
                     'options are --flags')
  values = flags.FLAGS
  try:
    imagenet_converter.convert(
        values.raw_data_dir, values.local_scratch_dir,
        {'train': values.train_shards, 'validation': values.validation_shards},
        values.num_workers, values.skip_bad_images, values.gcs_upload)
  except KeyboardInterrupt:
    raise RunStopped('interrupted by Ctrl-C (SIGINT); complete shards are '
                     'kept: rerun the same command to write the rest',
                     interrupts.EXIT_CODE) from None


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.define_main_flags(define_flags)
  # Not app.run: TensorFlow registers an absl init callback that scans for
  # GPUs, which logs CUDA errors on CPU-only machines and sets up a device
  # runtime, all to write files.
  app.define_help_flags()
  cli.run_main(main, cli.parse_flags_or_fail(sys.argv))


if __name__ == '__main__':
  run()
