"""Writes tiny ImageNet-format TFRecord datasets for tests, and damages
them as broken copies and disks do."""

import os
import shutil

import numpy as np
import tensorflow as tf

# Class names of records_run's labels.txt (the fixture: conftest.py).
CLASS_NAMES = ('ant', 'bee', 'cat', 'dog', 'eel', 'fox')


def example(jpeg: bytes, label: int, height: int, width: int,
             boxes=None) -> bytes:
  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

  def raw(v):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

  feature = {'image/encoded': raw(jpeg), 'image/class/label': ints(label),
             'image/height': ints(height), 'image/width': ints(width),
             'image/format': raw(b'JPEG')}
  if boxes:
    for i, key in enumerate(('ymin', 'xmin', 'ymax', 'xmax')):
      feature[f'image/object/bbox/{key}'] = tf.train.Feature(
          float_list=tf.train.FloatList(value=[b[i] for b in boxes]))
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


def write_dataset(root, num_classes=3, train_per_shard=(6, 6, 5),
                  eval_per_shard=(4, 3), layout='nested', seed=0):
  """Writes shards; image i of class c is a flat colour unique to (split, i).

  Labels in the records are 1-based (1..num_classes). Returns the 0-based
  labels per split in file order.
  """
  rng = np.random.RandomState(seed)
  labels = {}
  for split, counts in (('train', train_per_shard),
                        ('validation', eval_per_shard)):
    folder = os.path.join(root, split) if layout == 'nested' else root
    os.makedirs(folder, exist_ok=True)
    labels[split] = []
    for shard, count in enumerate(counts):
      path = os.path.join(folder, f'{split}-{shard:05d}-of-{len(counts):05d}')
      with tf.io.TFRecordWriter(path) as writer:
        for _ in range(count):
          h, w = rng.randint(40, 80), rng.randint(40, 80)
          label = int(rng.randint(num_classes))
          pixels = np.full([h, w, 3], rng.randint(0, 256, 3), np.uint8)
          jpeg = tf.io.encode_jpeg(pixels, quality=100).numpy()
          boxes = [(0.1, 0.1, 0.9, 0.9)] if split == 'train' else None
          writer.write(example(jpeg, label + 1, h, w, boxes))
          labels[split].append(label)
  return labels


def truncate(path, keep_fraction=0.6):
  """Cuts a shard mid-record, as an interrupted copy would."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:int(len(data) * keep_fraction)])


def append_undecodable(path, label=1):
  """Rewrites the shard with one more record whose image is not a JPEG."""
  records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
  records.append(example(b'\xff\xd8\xff not really a jpeg', label, 8, 8))
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)


def copy_dataset(root, tmp_path):
  """A copy of the dataset at `root` in tmp_path/data, to damage."""
  copy = str(tmp_path / 'data')
  shutil.copytree(root, copy)
  return copy
