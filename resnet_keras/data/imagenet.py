"""ImageNet-format TFRecords: finding shards, sizes, and the tf.data pipeline.

Each record is the standard tf.train.Example of one image
(imagenet_record.py), as written by preprocess_imagenet.py and by the Model
Garden's converters. The directory layouts users have are found:
`train/train-*` + `validation/validation-*` (ours and the reference
trainer's), the flat `train-*` + `validation-*` (Model Garden's), and
`img_train/img_train-*` + `img_val/img_val-*` (what the reference's
converter writes).

Training: file-level sharding per input pipeline (worker), file shuffle,
parallel interleave, record shuffle, parallel fused decode-and-crop, flip,
resize, batch with drop_remainder; cached whole images (no crop) are decoded
and resized once, before the cache, so only the flip runs per epoch.
Evaluation: every record exactly once, aspect-preserving resize + central
crop, the last partial batch kept.

Corrupt data: by default a bad record stops the run, and `find_corrupt_file`
names the shard. With a `SkippedRecords` counter the pipeline skips instead:
an undecodable image is dropped (and counted), and a TFRecord framing error
ends that shard's reading (TFRecord cannot resynchronise) with a warning
from TensorFlow naming the error.
"""

import json
import os
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from resnet_keras.config import RunConfig
from resnet_keras.data import augment
from resnet_keras.data import imagenet_record
from resnet_keras.data.preprocessing import augmentation_seed
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.data.preprocessing import training_order
from resnet_keras.data.preprocessing import with_private_threads
from common.errors import UsageError
from resnet_keras.files import kind_of

SPLIT_PATTERNS = {
    'train': ('train/train-*-of-*', 'train-*-of-*',
              'img_train/img_train-*-of-*'),
    'validation': ('validation/validation-*-of-*', 'validation-*-of-*',
                   'img_val/img_val-*-of-*'),
}
METADATA_FILE = 'metadata.json'
LABELS_FILE = 'labels.txt'
# Eval resizes the short side to image_size / fraction, then crops the
# centre. The defaults are the flags' (RunConfig's).
DEFAULT_EVAL_CROP_FRACTION = RunConfig.eval_crop_fraction
DEFAULT_CROP_MIN_AREA = RunConfig.train_crop_min_area
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
SHUFFLE_BUFFER = 10_000
INTERLEAVE_CYCLE = 10


def find_shards(data_dir: str, split: str) -> List[str]:
  """Sorted shard paths of `split`, from whichever layout data_dir uses."""
  if not os.path.isdir(data_dir):
    raise UsageError(f'--data_dir={data_dir} {kind_of(data_dir)}; point '
                     'it at the directory of TFRecords written by '
                     'preprocess_imagenet.py')
  files = _nonempty_shards(data_dir, split)
  if files:
    return files
  # The reference's steps write the records one level down
  # (IMAGENET_HOME/tf_records) from the directory it suggests as data_dir.
  subdirs = (os.path.join(data_dir, n) for n in sorted(os.listdir(data_dir)))
  nested = next((d for d in subdirs
                 if os.path.isdir(d) and _nonempty_shards(d, split)), None)
  if nested:
    raise UsageError(f'no {split} shards in --data_dir={data_dir}, but '
                     f'{nested} has them; pass --data_dir={nested}')
  raise UsageError(
      f'no non-empty {split} shards in --data_dir={data_dir} (looked for '
      f'{", ".join(SPLIT_PATTERNS[split])}); convert images with '
      'preprocess_imagenet.py')


def _nonempty_shards(data_dir: str, split: str) -> List[str]:
  """Shards of the first layout that has any non-empty ones."""
  for pattern in SPLIT_PATTERNS[split]:
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, pattern)))
    files = [f for f in files if os.path.getsize(f) > 0]
    if files:
      return files
  return []


def read_metadata(data_dir: str) -> Optional[Dict]:
  """The converter's metadata.json (class and example counts), if present."""
  path = os.path.join(data_dir, METADATA_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise UsageError(f'{path} is unreadable ({e}); delete it to count the '
                     'examples from the shards instead') from None


def _record_reader(skip_corrupt: bool):
  """TFRecordDataset, or one that ends a shard quietly at a corrupt record."""
  if not skip_corrupt:
    return tf.data.TFRecordDataset
  return lambda files: tf.data.TFRecordDataset(files).apply(
      tf.data.experimental.ignore_errors(log_warning=True))


def scan_shards(files: List[str], skip_corrupt: bool = False) -> Dict[str, int]:
  """Counts records and finds the largest label by reading every record."""
  labels = tf.data.Dataset.from_tensor_slices(files).interleave(
      _record_reader(skip_corrupt), cycle_length=INTERLEAVE_CYCLE,
      num_parallel_calls=tf.data.AUTOTUNE).map(
          imagenet_record.stored_label,
          num_parallel_calls=tf.data.AUTOTUNE).batch(4096)
  count, max_label = 0, 0
  try:
    for batch in labels:
      count += int(batch.shape[0])
      max_label = max(max_label, int(tf.reduce_max(batch)))
  except tf.errors.DataLossError as e:
    path, reason = find_corrupt_file(files) or ('one of the shards',
                                               _first_line(e.message))
    raise UsageError(f'corrupt record in {path} ({reason}) while counting '
                     'examples; regenerate that file, or rerun with '
                     '--skip_corrupt_records to skip bad records') from None
  return {'num_examples': count, 'max_label': max_label}


def describe(data_dir: str, train_files: List[str], eval_files: List[str],
             skip_corrupt: bool = False) -> Dict[str, int]:
  """Class count and examples per split, from metadata or by counting.

  `train_files`/`eval_files` are the shards find_shards returned; they are
  only read when data_dir has no metadata.json.
  """
  metadata = read_metadata(data_dir)
  if metadata:
    return {'num_classes': int(metadata['num_classes']),
            'num_train_examples': int(metadata['num_examples']['train']),
            'num_eval_examples': int(metadata['num_examples']['validation'])}
  train, validation = (scan_shards(files, skip_corrupt)
                       for files in (train_files, eval_files))
  num_classes = max(train['max_label'], validation['max_label'])
  labels_path = find_labels(data_dir)
  if labels_path:
    num_classes = len(read_labels(labels_path))
  return {'num_classes': num_classes,
          'num_train_examples': train['num_examples'],
          'num_eval_examples': validation['num_examples']}


class SkippedRecords:
  """How many records the pipelines dropped as undecodable.

  Each parse counts an attempt before decoding and a success after it; a
  failed decode is dropped by `ignore_errors`, so the difference is the
  number skipped (exact once the pipelines are idle, e.g. at the end).
  """

  def __init__(self):
    with tf.init_scope(), tf.device('/cpu:0'):
      self._attempted = tf.Variable(0, dtype=tf.int64, trainable=False)
      self._decoded = tf.Variable(0, dtype=tf.int64, trainable=False)

  def around(self, parse_fn):
    """`parse_fn` (-> (image, label)) with the attempt counted."""

    def counted(*element):
      with tf.control_dependencies([self._attempted.assign_add(1)]):
        image, label = parse_fn(*element)
      with tf.control_dependencies([image, label]):
        done = self._decoded.assign_add(1)
      with tf.control_dependencies([done]):
        return tf.identity(image), tf.identity(label)

    return counted

  @property
  def count(self) -> int:
    return int(self._attempted.numpy() - self._decoded.numpy())


def find_corrupt_file(files: List[str]) -> Optional[Tuple[str, str]]:
  """(path, reason) of the first shard with an unreadable record or an
  undecodable image, or None. Reads every record: only for error messages."""
  for path in files:
    records = tf.data.TFRecordDataset(path).map(
        lambda r: tf.shape(tf.io.decode_jpeg(imagenet_record.parse(r)[0]))[0],
        num_parallel_calls=tf.data.AUTOTUNE)
    try:
      records.reduce(0, lambda count, _: count + 1)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
      return path, _first_line(e.message)
  return None


def _first_line(message: str) -> str:
  """TensorFlow's error text without its function-node prefix."""
  line = message.strip().splitlines()[0]
  return line.split('}} ', 1)[-1].split(' [Op:', 1)[0][:200]


def find_labels(data_dir: str) -> Optional[str]:
  """The converter's labels.txt in data_dir, if it wrote one."""
  path = os.path.join(data_dir, LABELS_FILE)
  return path if os.path.isfile(path) else None


def read_labels(path: str) -> List[str]:
  """Class names: line k names the records' label k + 1 (model output k)."""
  with open(path, encoding='utf-8') as f:
    return [line.strip() for line in f if line.strip()]


def _to_loader_dtype(image, dtype):
  """Float pixels -> the loader's dtype (uint8: raw pixels, else normalised)."""
  if dtype == tf.uint8:
    # Bilinear resizing (no antialiasing) of uint8 pixels is a convex
    # combination, so it stays in [0, 255]: no clip needed, and the cast's
    # truncation of x + 0.5 rounds. 8% less per image than round + clip.
    return tf.cast(image + 0.5, tf.uint8)
  return normalize_images(image, dtype)


def preprocess_train(image_bytes, boxes, image_size, dtype, crop_seed,
                     flip_seed, crop_min_area=DEFAULT_CROP_MIN_AREA,
                     augmentation=augment.ImageAugmentation()):
  """Random crop (fused with JPEG decode), random flip, resize, then
  `augmentation` (RandAugment, random erasing; seeded by `crop_seed`); the
  randomness comes from the two stateless-op seeds."""
  shape = tf.image.extract_jpeg_shape(image_bytes)
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, bounding_boxes=boxes, seed=crop_seed, min_object_covered=0.1,
      aspect_ratio_range=CROP_ASPECT_RANGE, area_range=(crop_min_area, 1.0),
      max_attempts=10, use_image_if_no_bounding_boxes=True)
  offset_y, offset_x, _ = tf.unstack(begin)
  height, width, _ = tf.unstack(size)
  image = tf.image.decode_and_crop_jpeg(
      image_bytes, tf.stack([offset_y, offset_x, height, width]), channels=3)
  image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
  image = tf.image.resize(image, [image_size, image_size])
  image = tf.ensure_shape(image, [image_size, image_size, 3])
  if augmentation:
    image = augmentation(image, crop_seed)
  return _to_loader_dtype(image, dtype)


def decode_whole(image_bytes, image_size):
  """The whole image resized to `image_size` as uint8 pixels: a training
  crop of the full area (`crop_min_area` 1), done once for a decoded cache."""
  image = tf.image.decode_jpeg(image_bytes, channels=3)
  image = tf.image.resize(image, [image_size, image_size])
  return _to_loader_dtype(tf.ensure_shape(image, [image_size, image_size, 3]),
                          tf.uint8)


def preprocess_eval(image_bytes, image_size, dtype,
                    crop_fraction=DEFAULT_EVAL_CROP_FRACTION):
  """Aspect-preserving resize of the short side, then a central crop that
  keeps `crop_fraction` of it (1.0: the whole short side).

  `image_bytes` may be JPEG or PNG (TensorFlow's JPEG decoder reads both),
  grayscale, RGB or RGBA: the result always has 3 channels. The exported
  SavedModel serves encoded images with this function too.
  """
  image = tf.image.decode_jpeg(image_bytes, channels=3)
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = image_size / crop_fraction / tf.reduce_min(shape)
  new_size = tf.cast(tf.round(shape * scale), tf.int32)
  image = tf.image.resize(image, new_size)
  top = (new_size[0] - image_size) // 2
  left = (new_size[1] - image_size) // 2
  image = image[top:top + image_size, left:left + image_size]
  return _to_loader_dtype(tf.ensure_shape(image, [image_size, image_size, 3]),
                          dtype)


def dataset(files: List[str], *, is_training: bool, batch_size: int,
            image_size: int, dtype: tf.DType, num_classes: int,
            input_pipeline_id: int = 0, num_input_pipelines: int = 1,
            cache: bool = False, num_private_threads: int = 0,
            seed: Optional[int] = None, limit: int = 0,
            crop_min_area: float = DEFAULT_CROP_MIN_AREA,
            eval_crop_fraction: float = DEFAULT_EVAL_CROP_FRACTION,
            skipped: Optional[SkippedRecords] = None,
            start_record: int = 0,
            augmentation: augment.ImageAugmentation = (
                augment.ImageAugmentation()),
            mixing: augment.BatchMixing = augment.BatchMixing(),
            repeats: int = 1) -> tf.data.Dataset:
  """Batches of (images, 0-based labels) for one input pipeline.

  Args:
    files: shard paths (find_shards).
    is_training: augment, shuffle, repeat and drop the last partial batch.
    batch_size: per-replica batch.
    image_size: output height and width.
    dtype: tf.float32 / tf.bfloat16 (normalised) or tf.uint8 (raw pixels).
    num_classes: labels outside [0, num_classes) stop the run with an error.
    input_pipeline_id: this pipeline's index (tf.distribute or Horovod rank).
    num_input_pipelines: how many pipelines share the files.
    cache: training only: cache the raw records in memory after the first
      epoch (evaluation reads each record once per eval anyway); with
      `crop_min_area` 1, their decoded, resized pixels instead.
    num_private_threads: > 0: a private threadpool of that size.
    seed: fixes file and record order (None: a fresh order every run).
    limit: > 0: only the first `limit` records (in file order) are used.
    crop_min_area: smallest fraction of the image a training crop covers.
    eval_crop_fraction: fraction of the short side the eval crop keeps.
    skipped: skip corrupt records and count them here (None: they stop the
      run with tf.errors.DataLossError or InvalidArgumentError).
    start_record: training only: skip this many records of the (seeded)
      training order; a resumed run passes what its first steps consumed.
    augmentation: training only: what each image gets after its crop and
      flip (augment.ImageAugmentation).
    mixing: training only: mixup/CutMix of each batch; on, the labels
      become soft targets [batch, num_classes].
    repeats: training only: each record this many times in a row
      (repeated augmentation; preprocessing.training_order).
  """
  read = _record_reader(skipped is not None)
  if limit:
    ds = read(files).take(limit).shard(
        num_input_pipelines, input_pipeline_id)
  elif len(files) >= num_input_pipelines:
    # File-level sharding: each pipeline reads only its own files.
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.shard(num_input_pipelines, input_pipeline_id)
    if is_training:
      ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(read,
                       cycle_length=INTERLEAVE_CYCLE if is_training else 1,
                       num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=not is_training or seed is not None)
  else:
    # Too few files to split: every pipeline reads them in the same fixed
    # order and keeps every n-th record, so the shares stay disjoint.
    ds = read(files).shard(num_input_pipelines, input_pipeline_id)
  deterministic = not is_training or seed is not None

  def parse_and_decode(record):
    image_bytes, label, _ = imagenet_record.parse(record)
    return decode_whole(image_bytes, image_size), label

  def parse_and_preprocess(position, record):
    image_bytes, label, boxes = imagenet_record.parse(record)
    if is_training:
      image = preprocess_train(
          image_bytes, boxes, image_size, dtype,
          augmentation_seed(seed, position), augmentation_seed(seed, position, 1),
          crop_min_area, augmentation)
    else:
      image = preprocess_eval(image_bytes, image_size, dtype,
                              eval_crop_fraction)
    return image, label

  def flip(position, element):
    image, label = element
    image = tf.image.stateless_random_flip_left_right(
        image, seed=augmentation_seed(seed, position, 1))
    if augmentation:
      image = augmentation(tf.cast(image, tf.float32),
                           augmentation_seed(seed, position))
      return _to_loader_dtype(image, dtype), label
    return (image if dtype == tf.uint8 else normalize_images(image, dtype),
            label)

  def decode(ds, fn, *, deterministic):
    if skipped:
      fn = skipped.around(fn)
    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic)
    return ds.apply(tf.data.experimental.ignore_errors()) if skipped else ds

  # Without a crop (its area fixed at the whole image) the decode and resize
  # are the same every epoch: a cache can hold their pixels, and only the
  # flip is left per epoch (the quick start: 3.5% more training img/s).
  decoded_cache = cache and is_training and crop_min_area >= 1.0
  if decoded_cache:
    ds = decode(ds, parse_and_decode, deterministic=True)
  if cache and is_training:
    ds = ds.cache()
  if is_training:
    ds = training_order(ds, SHUFFLE_BUFFER, seed, start_record, repeats)
  else:
    ds = ds.enumerate()  # Positions are unused; one element structure.
  if decoded_cache:
    ds = ds.map(flip, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic)
  else:
    ds = decode(ds, parse_and_preprocess, deterministic=deterministic)

  def check_labels(images, labels):
    # After the skipping: a wrong label is a wrong dataset, not a bad record.
    # Checked per batch, after `batch`, so tf.data can fuse the parallel map
    # with the batching (an element-wise map between them prevents it).
    tf.debugging.assert_less(
        labels, num_classes, message='label out of range for the model')
    tf.debugging.assert_non_negative(labels, message='label out of range '
                                     '(labels are 1-based in the records)')
    return images, labels

  ds = ds.batch(batch_size, drop_remainder=is_training).map(check_labels)
  if is_training:
    ds = augment.mix_batches(ds, mixing, seed, start_record // batch_size)
  return with_private_threads(ds.prefetch(tf.data.AUTOTUNE),
                              num_private_threads)
