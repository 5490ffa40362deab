"""preprocess_imagenet.py's library (data/imagenet_converter.py): its
functions, and its conversion called in this process, on a tiny raw tree
built with Pillow (support/converter.py). (The script as users run it: e2e/
for its usage errors, processes/ for its conversions with worker
processes.)"""

import io
import os

import numpy as np
import pytest
from PIL import Image

from resnet_keras.data import imagenet_converter
from resnet_keras import files
from common.errors import UsageError
from tests.support.converter import (NUM_VALIDATION, SYNSETS, TRAIN_PER_CLASS,
                                     convert_in_process, encoded, feature,
                                     make_raw, pil_image, read_split,
                                     reference_layout, write_bytes)

# --- Pure functions --------------------------------------------------------


def test_encode_image_passes_rgb_jpeg_through():
  data = encoded(pil_image(30, 20, 0), 'JPEG')
  assert imagenet_converter.encode_image(data) == (data, 20, 30)


@pytest.mark.parametrize('mode,fmt', [('RGB', 'PNG'), ('RGBA', 'PNG'),
                                      ('CMYK', 'JPEG'), ('L', 'JPEG'),
                                      ('L', 'PNG'), ('P', 'PNG')])
def test_encode_image_reencodes_everything_else_as_rgb_jpeg(mode, fmt):
  source = Image.new('RGB', (30, 20), (200, 40, 10)).convert(mode)
  jpeg, height, width = imagenet_converter.encode_image(encoded(source, fmt))
  with Image.open(io.BytesIO(jpeg)) as image:
    assert (image.format, image.mode, image.size) == ('JPEG', 'RGB', (30, 20))
    expected = source.convert('RGB').getpixel((15, 10))
    assert np.allclose(image.getpixel((15, 10)), expected, atol=10)
  assert (height, width) == (20, 30)


@pytest.mark.parametrize('data', [
    b'', b'not an image at all',
    encoded(pil_image(64, 64, 0), 'JPEG')[:600],  # truncated
    encoded(pil_image(64, 64, 0), 'PNG')[:300],
])
def test_encode_image_rejects_undecodable_data(data):
  with pytest.raises(imagenet_converter.BadImageError):
    imagenet_converter.encode_image(data)


@pytest.mark.parametrize('n,k', [(10, 3), (7, 7), (1024, 1024), (5, 1)])
def test_plan_shards_is_balanced_and_keeps_order(n, k):
  images = list(range(n))
  shards = imagenet_converter.plan_shards(images, k)
  assert len(shards) == k
  assert sum(shards, []) == images
  assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_effective_num_shards_never_leaves_a_shard_empty():
  assert imagenet_converter.effective_num_shards(10, 4) == 4
  assert imagenet_converter.effective_num_shards(3, 128) == 3


def test_shuffled_is_deterministic():
  images = list(range(50))
  shuffled = imagenet_converter.shuffled(images)
  assert shuffled == imagenet_converter.shuffled(images) != images
  assert sorted(shuffled) == images


def test_shard_and_temporary_names():
  assert imagenet_converter.shard_name('train', 3, 1024) == (
      'train-00003-of-01024')
  assert files.temporary_path('/o/train/train-00003-of-00008') == (
      '/o/train/.train-00003-of-00008.tmp')


def test_list_train_labels_follow_sorted_synsets(tmp_path):
  raw = make_raw(str(tmp_path))
  synsets, images = imagenet_converter.list_train(raw)
  assert synsets == SYNSETS
  assert len(images) == len(SYNSETS) * TRAIN_PER_CLASS
  for image in images:
    assert image.label == SYNSETS.index(image.synset) + 1
    assert os.path.basename(os.path.dirname(image.path)) == image.synset
  names = {os.path.basename(i.path) for i in images}
  assert 'README.txt' not in names and '._x.JPEG' not in names
  assert {'n01440764_1.jpg', 'n01443537_1.PNG', 'n01484850_1.jpeg'} <= names


@pytest.mark.parametrize('layout', ['labels_file', 'class_folders'])
def test_list_validation_layouts_agree(tmp_path, layout):
  raw = make_raw(str(tmp_path), layout)
  images = imagenet_converter.list_validation(raw, SYNSETS)
  got = sorted((os.path.basename(i.path), i.synset, i.label) for i in images)
  expected = [(f'ILSVRC2012_val_{i + 1:08d}.JPEG', SYNSETS[i % 3],
               i % 3 + 1) for i in range(NUM_VALIDATION)]
  assert got == expected


def test_count_records_reads_headers(tmp_path):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / 'records')
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(5):
      writer.write(b'x' * i * 100)
  assert imagenet_converter.count_records(path) == 5
  with open(path, 'rb') as f:
    data = f.read()
  write_bytes(path, data[:-3])
  with pytest.raises(UsageError, match='truncated'):
    imagenet_converter.count_records(path)


def test_format_progress():
  assert imagenet_converter.format_progress(2, 8, 500, 2000, 5.0) == (
      '2/8 shards, 500/2000 images, 100.0 images/sec, ETA 15s')


# --- Bad input, reported in process (fast) ----------------------------------


def _remove_images(folder):
  for name in os.listdir(folder):
    os.remove(os.path.join(folder, name))


@pytest.mark.parametrize('breakage,message', [
    (lambda raw: os.rename(os.path.join(raw, 'train'),
                           os.path.join(raw, 'x')), 'raw/train'),
    (lambda raw: os.rename(os.path.join(raw, 'validation'),
                           os.path.join(raw, 'x')), 'raw/validation'),
    (lambda raw: _remove_images(os.path.join(raw, 'train', SYNSETS[1])),
     os.path.join('raw', 'train', SYNSETS[1]) + ' has no images'),
    (lambda raw: write_bytes(os.path.join(raw, 'synset_labels.txt'),
                             b'n01440764\n'), 'has 1 synsets but'),
    (lambda raw: write_bytes(os.path.join(raw, 'synset_labels.txt'),
                             b'n01440764\nn99999999\n' * 3),
     'line 2: n99999999 is not a training class'),
    (lambda raw: _remove_images(os.path.join(raw, 'validation')),
     'raw/validation has no images'),
], ids=['no_train', 'no_validation', 'empty_class', 'labels_count',
        'unknown_synset', 'empty_validation'])
def test_bad_raw_trees_are_usage_errors(tmp_path, breakage, message):
  raw = make_raw(str(tmp_path))
  breakage(raw)
  with pytest.raises(UsageError, match=message):
    convert_in_process(raw, str(tmp_path / 'out'))


@pytest.mark.parametrize('layout', ['labels_file', 'class_folders'])
def test_reference_folder_names_list_the_same_images(tmp_path, layout):
  standard = make_raw(str(tmp_path / 'a'), layout)
  reference = make_raw(str(tmp_path / 'b'), layout)
  reference_layout(reference)

  def listed(raw):
    synsets, train = imagenet_converter.list_train(raw)
    rows = train + imagenet_converter.list_validation(raw, synsets)
    return synsets, [(os.path.relpath(i.path, raw).split(os.sep, 1)[1],
                      i.synset, i.label) for i in rows]

  assert listed(reference) == listed(standard)
  assert len(listed(reference)[1]) == 3 * TRAIN_PER_CLASS + NUM_VALIDATION


@pytest.mark.parametrize('split,names', [('train', ('train', 'img_train')),
                                         ('validation', ('validation',
                                                         'img_val'))])
def test_both_folder_names_for_one_split_is_refused(tmp_path, split, names):
  raw = make_raw(str(tmp_path))
  os.makedirs(os.path.join(raw, names[1], SYNSETS[0]))
  with pytest.raises(UsageError, match=f'raw/{names[0]} and .*raw/{names[1]} '
                     'exist; keep one'):
    convert_in_process(raw, str(tmp_path / 'out'))


def test_validation_class_folder_must_be_a_training_class(tmp_path):
  raw = make_raw(str(tmp_path), 'class_folders')
  os.rename(os.path.join(raw, 'validation', SYNSETS[2]),
            os.path.join(raw, 'validation', 'n77777777'))
  with pytest.raises(UsageError, match='n77777777 is not a training class'):
    convert_in_process(raw, str(tmp_path / 'out'))


def test_validation_needs_labels_file_or_class_folders(tmp_path):
  raw = make_raw(str(tmp_path))
  os.remove(os.path.join(raw, 'synset_labels.txt'))
  with pytest.raises(UsageError, match='no class folders'):
    convert_in_process(raw, str(tmp_path / 'out'))


@pytest.mark.parametrize('shards', [{'train_shards': 0},
                                    {'validation_shards': -1}])
def test_shard_counts_must_be_positive(tmp_path, shards):
  with pytest.raises(UsageError, match='_shards must be at least 1'):
    convert_in_process(make_raw(str(tmp_path)), str(tmp_path / 'out'),
                       **shards)


def test_unwritable_output_dir(tmp_path):
  write_bytes(str(tmp_path / 'a_file'), b'')
  with pytest.raises(UsageError, match='cannot write to output directory'):
    convert_in_process(make_raw(str(tmp_path)), str(tmp_path / 'a_file' / 'o'))


def test_changed_shard_count_is_refused(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  write_bytes(os.path.join(out, 'train', 'train-00000-of-00003'), b'')
  with pytest.raises(UsageError, match='--train_shards 3'):
    convert_in_process(raw, out)


def test_rgb_jpegs_are_stored_byte_for_byte(tmp_path):
  raw, out = make_raw(str(tmp_path), 'class_folders'), str(tmp_path / 'out')
  convert_in_process(raw, out, train_shards=1, validation_shards=1)
  for _, example in read_split(out, 'validation'):
    synset = feature(example, 'image/class/synset')[0].decode()
    name = feature(example, 'image/filename')[0].decode()
    with open(os.path.join(raw, 'validation', synset, name), 'rb') as f:
      assert feature(example, 'image/encoded')[0] == f.read()
