"""The ImageNet TFRecord pipeline (resnet_keras/data/imagenet.py) on tiny
datasets written by the test. (Runs on them: e2e/.)"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.data import imagenet
from resnet_keras.data import imagenet_record
from resnet_keras.data.preprocessing import normalize_images
from common.errors import UsageError
from tests.support.records import example
from tests.support.records import write_dataset


@pytest.mark.parametrize('boxes', [[], [(0.1, 0.2, 0.5, 0.6)],
                                   [(0.1, 0.2, 0.5, 0.6), (0.0, 0.3, 1.0, 0.9)]])
def test_parse_record_returns_label_and_boxes_in_y_x_order(boxes):
  # The records store each coordinate as its own list (image/object/bbox/
  # xmin, ymin, ...); the crop sampler wants them regrouped per box as
  # [1, num_boxes, (ymin, xmin, ymax, xmax)].
  record = example(b'jpeg', 7, 10, 10, boxes=boxes)
  image_bytes, label, parsed = imagenet_record.parse(tf.constant(record))
  assert image_bytes.numpy() == b'jpeg'
  assert int(label) == 6  # 1-based in the record.
  assert parsed.shape == (1, len(boxes), 4)
  np.testing.assert_allclose(parsed.numpy().reshape(-1, 4),
                             np.array(boxes, np.float32).reshape(-1, 4))


@pytest.mark.parametrize('layout', ['nested', 'flat'])
def test_finds_shards_in_both_layouts(tmp_path, layout):
  write_dataset(str(tmp_path), layout=layout)
  train = imagenet.find_shards(str(tmp_path), 'train')
  validation = imagenet.find_shards(str(tmp_path), 'validation')
  assert [f.rsplit('/', 1)[1] for f in train] == [
      'train-00000-of-00003', 'train-00001-of-00003', 'train-00002-of-00003']
  assert len(validation) == 2


def test_finds_the_reference_converters_img_train_layout(tmp_path):
  write_dataset(str(tmp_path))
  for split, name in (('train', 'img_train'), ('validation', 'img_val')):
    os.makedirs(tmp_path / name)
    for shard in sorted(os.listdir(tmp_path / split)):
      os.rename(tmp_path / split / shard,
                tmp_path / name / shard.replace(split, name))
  train = imagenet.find_shards(str(tmp_path), 'train')
  assert [f.rsplit('/', 1)[1] for f in train] == [
      f'img_train-{i:05d}-of-00003' for i in range(3)]
  assert len(imagenet.find_shards(str(tmp_path), 'validation')) == 2


def test_shards_one_level_down_are_named_in_the_error(tmp_path):
  """The reference writes IMAGENET_HOME/tf_records below its data_dir."""
  write_dataset(str(tmp_path / 'tf_records'))
  (tmp_path / 'img_train').mkdir()
  with pytest.raises(UsageError) as e:
    imagenet.find_shards(str(tmp_path), 'train')
  assert f'pass --data_dir={tmp_path / "tf_records"}' in str(e.value)


def test_missing_and_empty_dirs_name_the_directory_and_patterns(tmp_path):
  with pytest.raises(UsageError, match='does not exist'):
    imagenet.find_shards(str(tmp_path / 'nope'), 'train')
  (tmp_path / 'train').mkdir()
  (tmp_path / 'train' / 'train-00000-of-00001').write_bytes(b'')
  with pytest.raises(UsageError) as e:
    imagenet.find_shards(str(tmp_path), 'train')
  assert str(tmp_path) in str(e.value)
  assert 'train/train-*-of-*' in str(e.value)
  assert 'preprocess_imagenet.py' in str(e.value)


def test_describe_counts_records_or_reads_metadata(data_dir, tmp_path):
  root, labels = data_dir
  sizes = imagenet.describe(root, imagenet.find_shards(root, 'train'),
                            imagenet.find_shards(root, 'validation'))
  assert sizes['num_train_examples'] == 17 and sizes['num_eval_examples'] == 7
  assert sizes['num_classes'] == max(labels['train'] + labels['validation']) + 1
  write_dataset(str(tmp_path))
  (tmp_path / 'metadata.json').write_text(json.dumps(
      {'num_classes': 5, 'num_examples': {'train': 17, 'validation': 7}}))
  # With metadata the shards are not read, so no file list is needed.
  assert imagenet.describe(str(tmp_path), [], [])['num_classes'] == 5


def _collect(ds):
  images, labels = [], []
  for x, y in ds:
    images.append(x.numpy())
    labels.append(y.numpy())
  return images, labels


def test_training_batches_shapes_dtypes_and_labels(data_dir):
  root, labels = data_dir
  files = imagenet.find_shards(root, 'train')
  for dtype in (tf.float32, tf.bfloat16, tf.uint8):
    ds = imagenet.dataset(files, is_training=True, batch_size=4,
                          image_size=32, dtype=dtype, num_classes=3)
    images, batch_labels = next(iter(ds))
    assert images.shape == (4, 32, 32, 3) and images.dtype == dtype
    assert batch_labels.dtype == tf.int32
    assert set(batch_labels.numpy()) <= {0, 1, 2}   # shifted to 0-based


def test_eval_keeps_every_example_in_order(data_dir):
  root, labels = data_dir
  files = imagenet.find_shards(root, 'validation')
  ds = imagenet.dataset(files, is_training=False, batch_size=3, image_size=32,
                        dtype=tf.float32, num_classes=3)
  images, batch_labels = _collect(ds)
  assert [len(b) for b in batch_labels] == [3, 3, 1]   # partial batch kept
  assert np.concatenate(batch_labels).tolist() == labels['validation']


@pytest.mark.parametrize('num_pipelines', [2, 3])
def test_eval_shards_are_disjoint_and_complete(data_dir, num_pipelines):
  # 2 pipelines: file-level (2 files); 3 pipelines: record-level fallback.
  root, labels = data_dir
  files = imagenet.find_shards(root, 'validation')
  seen = []
  for index in range(num_pipelines):
    ds = imagenet.dataset(files, is_training=False, batch_size=2,
                          image_size=32, dtype=tf.uint8, num_classes=3,
                          input_pipeline_id=index,
                          num_input_pipelines=num_pipelines)
    images, _ = _collect(ds)
    seen += [tuple(img[16, 16]) for batch in images for img in batch]
  assert len(seen) == 7
  assert len(set(seen)) == 7    # every image (unique colour) exactly once


def test_training_file_shards_are_disjoint(data_dir):
  root, _ = data_dir
  files = imagenet.find_shards(root, 'train')
  colours = []
  for index in range(3):
    ds = imagenet.dataset(files, is_training=True, batch_size=1, image_size=32,
                          dtype=tf.uint8, num_classes=3,
                          input_pipeline_id=index, num_input_pipelines=3)
    colours.append({tuple(x[0, 16, 16].numpy()) for x, _ in ds.take(40)})
  assert not colours[0] & colours[1] and not colours[1] & colours[2]


@pytest.mark.parametrize('dtype,tolerance', [(tf.uint8, 1),
                                             (tf.float32, 0.5 + 1e-3)])
def test_a_decoded_cache_serves_what_decoding_every_epoch_serves(
    tmp_path, dtype, tolerance):
  # Whole-image crops: the cache holds decoded, resized pixels and only the
  # flip runs per epoch. Seeded, two epochs of batches equal the uncached
  # pipeline's, which flips before resizing: up to a rounding step (uint8) or
  # the cached pixels' rounding to uint8 (float loaders).
  path = str(tmp_path / 'train-00000-of-00001')
  rng = np.random.RandomState(0)
  with tf.io.TFRecordWriter(path) as writer:
    for label in range(10):
      pixels = rng.randint(0, 256, [28, 28, 3]).astype(np.uint8)
      writer.write(example(tf.io.encode_jpeg(pixels).numpy(), label % 3 + 1,
                            28, 28, None))
  kwargs = dict(is_training=True, batch_size=5, image_size=24, dtype=dtype,
                num_classes=3, seed=3, crop_min_area=1.0)
  cached = _collect(imagenet.dataset([path], cache=True, **kwargs).take(4))
  fresh = _collect(imagenet.dataset([path], cache=False, **kwargs).take(4))
  assert np.array_equal(cached[1], fresh[1])
  for a, b in zip(cached[0], fresh[0]):
    np.testing.assert_allclose(np.float32(a), np.float32(b), atol=tolerance)
  # The flip still runs per epoch: a record seen as is in epoch 1 comes back
  # mirrored in epoch 2.
  first = {image.tobytes() for image in np.concatenate(cached[0][:2])}
  assert any(image.tobytes() not in first and
             image[:, ::-1].tobytes() in first
             for image in np.concatenate(cached[0][2:]))


def test_uint8_path_equals_fp32_after_device_normalisation(data_dir):
  root, _ = data_dir
  files = imagenet.find_shards(root, 'validation')
  kwargs = dict(is_training=False, batch_size=7, image_size=32, num_classes=3)
  (u8, _), = imagenet.dataset(files, dtype=tf.uint8, **kwargs).take(1)
  (f32, _), = imagenet.dataset(files, dtype=tf.float32, **kwargs).take(1)
  np.testing.assert_allclose(normalize_images(u8).numpy(), f32.numpy(),
                             atol=0.5 + 1e-4)   # uint8 rounds to whole pixels


def test_labels_out_of_range_stop_the_pipeline(data_dir):
  root, _ = data_dir
  files = imagenet.find_shards(root, 'validation')
  ds = imagenet.dataset(files, is_training=False, batch_size=7, image_size=32,
                        dtype=tf.float32, num_classes=1)
  with pytest.raises(tf.errors.InvalidArgumentError, match='out of range'):
    _collect(ds)


def test_eval_crop_fraction_one_keeps_the_whole_image():
  pixels = np.random.RandomState(0).randint(0, 256, [40, 40, 3]).astype(np.uint8)
  encoded = tf.io.encode_png(pixels)  # Lossless: decode_jpeg reads PNG too.
  whole = imagenet.preprocess_eval(encoded, 40, tf.uint8, crop_fraction=1.0)
  np.testing.assert_array_equal(whole.numpy(), pixels)
  cropped = imagenet.preprocess_eval(encoded, 40, tf.uint8)
  assert cropped.shape == (40, 40, 3)
  assert not np.array_equal(cropped.numpy(), pixels)
