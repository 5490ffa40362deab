"""CIFAR-10/100 from the standard binary files.

CIFAR-10: `data_batch_1.bin` .. `data_batch_5.bin` and `test_batch.bin`, each
record 1 label byte + 3072 pixel bytes. CIFAR-100: `train.bin` and
`test.bin`, each record 1 coarse + 1 fine label byte + 3072 pixel bytes (the
fine label is used). Pixels are stored channel-major (3 x 32 x 32).
Training augmentation is the standard pad-4, random 32x32 crop, flip.
"""

import os
from typing import List, Optional

import tensorflow as tf

from resnet_keras.data import augment
from resnet_keras.data.preprocessing import augmentation_seed
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.data.preprocessing import training_order
from resnet_keras.data.preprocessing import with_private_threads
from common.errors import UsageError

IMAGE_BYTES = 32 * 32 * 3
SPECS = {
    'cifar10': {'train': [f'data_batch_{i}.bin' for i in range(1, 6)],
                'validation': ['test_batch.bin'], 'label_bytes': 1,
                'num_classes': 10},
    'cifar100': {'train': ['train.bin'], 'validation': ['test.bin'],
                 'label_bytes': 2, 'num_classes': 100},
}
PAD = 4


def find_files(data_dir: str, name: str, split: str) -> List[str]:
  """The split's binary files; a missing one is a one-line error."""
  spec = SPECS[name]
  # Accept the directory the archives unpack to, as well as data_dir itself.
  for folder in (data_dir, os.path.join(data_dir, 'cifar-10-batches-bin'),
                 os.path.join(data_dir, 'cifar-100-binary')):
    paths = [os.path.join(folder, f) for f in spec[split]]
    if all(os.path.isfile(p) for p in paths):
      return paths
  raise UsageError(f'--data_dir={data_dir} lacks the {name} {split} files '
                   f'({", ".join(spec[split])}); download the binary version')


def count_examples(files: List[str], name: str) -> int:
  record = SPECS[name]['label_bytes'] + IMAGE_BYTES
  total = 0
  for path in files:
    size = os.path.getsize(path)
    if size % record:
      raise UsageError(f'{path} is truncated or not a {name} binary file '
                       f'({size} bytes is not a multiple of {record})')
    total += size // record
  return total


def _decode(record, label_bytes):
  raw = tf.io.decode_raw(record, tf.uint8)
  label = tf.cast(raw[label_bytes - 1], tf.int32)
  image = tf.transpose(tf.reshape(raw[label_bytes:], [3, 32, 32]), [1, 2, 0])
  return image, label


def dataset(files: List[str], name: str, *, is_training: bool,
            batch_size: int, image_size: int, dtype: tf.DType,
            input_pipeline_id: int = 0, num_input_pipelines: int = 1,
            seed: Optional[int] = None, limit: int = 0, cache: bool = False,
            num_private_threads: int = 0,
            start_record: int = 0,
            augmentation: augment.ImageAugmentation = (
                augment.ImageAugmentation()),
            mixing: augment.BatchMixing = augment.BatchMixing(),
            repeats: int = 1) -> tf.data.Dataset:
  """Batches of (images, labels); images resized when image_size != 32.

  `cache` keeps the decoded-from-disk records in memory after the first
  epoch (training only); `num_private_threads` > 0 gives the pipeline a
  private threadpool; `start_record` skips that much of the training order
  (exact resume, see preprocessing.training_order). Training only:
  `augmentation` follows the crop and flip, `mixing` mixes each batch (the
  labels become soft targets), `repeats` repeats each record (see
  imagenet.dataset).
  """
  label_bytes = SPECS[name]['label_bytes']
  ds = tf.data.FixedLengthRecordDataset(files, label_bytes + IMAGE_BYTES)
  if limit:
    ds = ds.take(limit)
  ds = ds.shard(num_input_pipelines, input_pipeline_id)
  if cache and is_training:
    ds = ds.cache()
  if is_training:
    ds = training_order(ds, 50_000, seed, start_record, repeats)
  else:
    ds = ds.enumerate()  # Positions are unused; one element structure.

  def preprocess(position, record):
    image, label = _decode(record, label_bytes)
    if is_training:
      image = tf.image.pad_to_bounding_box(image, PAD, PAD, 32 + 2 * PAD,
                                           32 + 2 * PAD)
      image = tf.image.stateless_random_crop(
          image, [32, 32, 3], seed=augmentation_seed(seed, position))
      image = tf.image.stateless_random_flip_left_right(
          image, seed=augmentation_seed(seed, position, 1))
    if is_training and augmentation:
      image = tf.cast(augmentation(tf.cast(image, tf.float32),
                                   augmentation_seed(seed, position)),
                      tf.uint8)
    if image_size != 32:
      image = tf.cast(tf.round(tf.image.resize(image, [image_size] * 2)),
                      tf.uint8)
    if dtype != tf.uint8:
      image = normalize_images(image, dtype)
    return image, label

  ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE,
              deterministic=not is_training or seed is not None)
  ds = ds.batch(batch_size, drop_remainder=is_training)
  if is_training:
    ds = augment.mix_batches(ds, mixing, seed, start_record // batch_size)
  return with_private_threads(ds.prefetch(tf.data.AUTOTUNE),
                              num_private_threads)
