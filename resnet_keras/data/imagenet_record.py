"""One record of the ImageNet TFRecords: the tf.train.Example of one image,
written here for the converter that writes records (imagenet_converter.py)
and the pipeline that reads them (imagenet.py).

The features are the standard ones (TensorFlow's imagenet_to_gcs.py, the
Model Garden's converters): `image/encoded` JPEG bytes, `image/class/label`
1-based, the image's size, synset, file name and format, and optionally
`image/object/bbox/*` boxes (the Model Garden's training records carry
them; the converter's have none). The reader needs the image and the label
alone, so it reads records of every converter.
"""

from typing import Sequence, Tuple

import tensorflow as tf

ENCODED = 'image/encoded'
LABEL = 'image/class/label'
# Each coordinate is a list of its own; `parse` regroups them per box in
# this order, the crop sampler's.
BOX_COORDINATES = ('ymin', 'xmin', 'ymax', 'xmax')


def _box_key(coordinate: str) -> str:
  return f'image/object/bbox/{coordinate}'


_READ = {ENCODED: tf.io.FixedLenFeature([], tf.string),
         LABEL: tf.io.FixedLenFeature([], tf.int64),
         **{_box_key(c): tf.io.VarLenFeature(tf.float32)
            for c in BOX_COORDINATES}}


def encode(jpeg: bytes, label: int, height: int, width: int, synset: str,
           filename: str,
           boxes: Sequence[Tuple[float, float, float, float]] = ()) -> bytes:
  """The serialized Example of an RGB JPEG of class `label` (1-based);
  `boxes` as (ymin, xmin, ymax, xmax) fractions of the image."""

  def ints(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

  def text(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

  feature = {
      'image/height': ints(height), 'image/width': ints(width),
      'image/channels': ints(3), LABEL: ints(label),
      'image/colorspace': text(b'RGB'),
      'image/class/synset': text(synset.encode()),
      'image/format': text(b'JPEG'), 'image/filename': text(filename.encode()),
      ENCODED: text(jpeg)}
  for i, coordinate in enumerate(BOX_COORDINATES if boxes else ()):
    feature[_box_key(coordinate)] = tf.train.Feature(
        float_list=tf.train.FloatList(value=[box[i] for box in boxes]))
  example = tf.train.Example(features=tf.train.Features(feature=feature))
  # Sorted feature keys: a rewritten shard is identical to the original.
  return example.SerializeToString(deterministic=True)


def parse(serialized) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """-> (JPEG bytes, 0-based label, boxes [1, N, 4] as BOX_COORDINATES)."""
  parsed = tf.io.parse_single_example(serialized, _READ)
  # A 1-D VarLenFeature's values are its dense form: no SparseToDense ops.
  coords = [parsed[_box_key(c)].values for c in BOX_COORDINATES]
  boxes = tf.expand_dims(tf.stack(coords, axis=-1), 0)
  label = tf.cast(parsed[LABEL], tf.int32) - 1
  return parsed[ENCODED], label, boxes


def stored_label(serialized) -> tf.Tensor:
  """The record's label as stored (1-based), without decoding the rest."""
  return tf.io.parse_single_example(serialized, {LABEL: _READ[LABEL]})[LABEL]
