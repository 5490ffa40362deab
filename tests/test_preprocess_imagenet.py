"""Tests for preprocess_imagenet.py on a tiny raw tree built with Pillow."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import preprocess_imagenet as pi
from common import files
from common.errors import UsageError
from tests import e2e

REPO_ROOT = e2e.REPO_ROOT

SYNSETS = ['n01440764', 'n01443537', 'n01484850']
TRAIN_PER_CLASS = 7
NUM_VALIDATION = 6


def _image(width, height, seed, mode='RGB'):
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  return Image.fromarray(pixels).convert(mode)


def _encoded(image, fmt):
  out = io.BytesIO()
  image.save(out, format=fmt)
  return out.getvalue()


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)


def _class_images(folder, class_index):
  """Writes TRAIN_PER_CLASS images; each class holds one odd one."""
  for i in range(TRAIN_PER_CLASS):
    seed = class_index * 100 + i
    size = (24 + i, 16 + class_index)
    name = f'{SYNSETS[class_index]}_{i}.JPEG'
    if i == 0 and class_index == 0:  # a PNG disguised by its name
      data = _encoded(_image(*size, seed), 'PNG')
    elif i == 0 and class_index == 1:
      data = _encoded(_image(*size, seed, 'CMYK'), 'JPEG')
    elif i == 0 and class_index == 2:
      data = _encoded(_image(*size, seed, 'L'), 'JPEG')
    elif i == 1:  # other accepted extensions
      name = f'{SYNSETS[class_index]}_{i}' + ['.jpg', '.PNG', '.jpeg'][
          class_index]
      data = _encoded(_image(*size, seed),
                      'PNG' if name.endswith('.PNG') else 'JPEG')
    else:
      data = _encoded(_image(*size, seed), 'JPEG')
    _write(os.path.join(folder, name), data)


def make_raw(root, validation_layout='labels_file'):
  """A raw tree with 3 classes; returns its path."""
  raw = os.path.join(root, 'raw')
  for c, synset in enumerate(SYNSETS):
    _class_images(os.path.join(raw, 'train', synset), c)
  # Neither of these is an image to convert.
  _write(os.path.join(raw, 'train', SYNSETS[0], 'README.txt'), b'notes')
  _write(os.path.join(raw, 'train', SYNSETS[0], '._x.JPEG'), b'\0\5\26\7')
  val_synsets = [SYNSETS[i % len(SYNSETS)] for i in range(NUM_VALIDATION)]
  for i, synset in enumerate(val_synsets):
    name = f'ILSVRC2012_val_{i + 1:08d}.JPEG'
    data = _encoded(_image(20, 20, 1000 + i), 'JPEG')
    if validation_layout == 'labels_file':
      _write(os.path.join(raw, 'validation', name), data)
    else:
      _write(os.path.join(raw, 'validation', synset, name), data)
  if validation_layout == 'labels_file':
    with open(os.path.join(raw, 'synset_labels.txt'), 'w') as f:
      f.write(''.join(s + '\n' for s in val_synsets))
  return raw


def run_script(*args):
  return subprocess.run(
      [sys.executable, 'preprocess_imagenet.py', *args], cwd=REPO_ROOT,
      capture_output=True, text=True, check=False, timeout=120)


def convert_in_process(raw, out, train_shards=4, validation_shards=2,
                       skip_bad_images=False):
  return pi.convert(raw, out,
                    {'train': train_shards, 'validation': validation_shards},
                    num_workers=1, skip_bad_images=skip_bad_images)


def read_split(out, split):
  """(shard name, parsed example) of every record, in file order."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  records = []
  split_dir = os.path.join(out, split)
  for name in sorted(os.listdir(split_dir)):
    for record in tf.data.TFRecordDataset(os.path.join(split_dir, name)):
      records.append((name, tf.train.Example.FromString(record.numpy())))
  return records


def feature(example, key):
  f = example.features.feature[key]
  return list(f.int64_list.value) or list(f.bytes_list.value)


def assert_one_line_error(result, *fragments):
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('error: ')
  assert 'Traceback' not in result.stderr
  for fragment in fragments:
    assert fragment in lines[0]


# --- Pure functions --------------------------------------------------------


def test_encode_image_passes_rgb_jpeg_through():
  data = _encoded(_image(30, 20, 0), 'JPEG')
  assert pi.encode_image(data) == (data, 20, 30)


@pytest.mark.parametrize('mode,fmt', [('RGB', 'PNG'), ('RGBA', 'PNG'),
                                      ('CMYK', 'JPEG'), ('L', 'JPEG'),
                                      ('L', 'PNG'), ('P', 'PNG')])
def test_encode_image_reencodes_everything_else_as_rgb_jpeg(mode, fmt):
  source = Image.new('RGB', (30, 20), (200, 40, 10)).convert(mode)
  jpeg, height, width = pi.encode_image(_encoded(source, fmt))
  with Image.open(io.BytesIO(jpeg)) as image:
    assert (image.format, image.mode, image.size) == ('JPEG', 'RGB', (30, 20))
    expected = source.convert('RGB').getpixel((15, 10))
    assert np.allclose(image.getpixel((15, 10)), expected, atol=10)
  assert (height, width) == (20, 30)


@pytest.mark.parametrize('data', [
    b'', b'not an image at all',
    _encoded(_image(64, 64, 0), 'JPEG')[:600],  # truncated
    _encoded(_image(64, 64, 0), 'PNG')[:300],
])
def test_encode_image_rejects_undecodable_data(data):
  with pytest.raises(pi.BadImageError):
    pi.encode_image(data)


@pytest.mark.parametrize('n,k', [(10, 3), (7, 7), (1024, 1024), (5, 1)])
def test_plan_shards_is_balanced_and_keeps_order(n, k):
  images = list(range(n))
  shards = pi.plan_shards(images, k)
  assert len(shards) == k
  assert sum(shards, []) == images
  assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_effective_num_shards_never_leaves_a_shard_empty():
  assert pi.effective_num_shards(10, 4) == 4
  assert pi.effective_num_shards(3, 128) == 3


def test_shuffled_is_deterministic():
  images = list(range(50))
  assert pi.shuffled(images) == pi.shuffled(images) != images
  assert sorted(pi.shuffled(images)) == images


def test_shard_and_temporary_names():
  assert pi.shard_name('train', 3, 1024) == 'train-00003-of-01024'
  assert files.temporary_path('/o/train/train-00003-of-00008') == (
      '/o/train/.train-00003-of-00008.tmp')


def test_list_train_labels_follow_sorted_synsets(tmp_path):
  raw = make_raw(str(tmp_path))
  synsets, images = pi.list_train(raw)
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
  images = pi.list_validation(raw, SYNSETS)
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
  assert pi.count_records(path) == 5
  with open(path, 'rb') as f:
    data = f.read()
  _write(path, data[:-3])
  with pytest.raises(UsageError, match='truncated'):
    pi.count_records(path)


def test_format_progress():
  assert pi.format_progress(2, 8, 500, 2000, 5.0) == (
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
    (lambda raw: _write(os.path.join(raw, 'synset_labels.txt'),
                        b'n01440764\n'), 'has 1 synsets but'),
    (lambda raw: _write(os.path.join(raw, 'synset_labels.txt'),
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


def _reference_layout(raw):
  """Renames the split folders as the reference's extraction steps name them."""
  os.rename(os.path.join(raw, 'train'), os.path.join(raw, 'img_train'))
  os.rename(os.path.join(raw, 'validation'), os.path.join(raw, 'img_val'))


@pytest.mark.parametrize('layout', ['labels_file', 'class_folders'])
def test_reference_folder_names_list_the_same_images(tmp_path, layout):
  standard = make_raw(str(tmp_path / 'a'), layout)
  reference = make_raw(str(tmp_path / 'b'), layout)
  _reference_layout(reference)

  def listed(raw):
    synsets, train = pi.list_train(raw)
    rows = train + pi.list_validation(raw, synsets)
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
  _write(str(tmp_path / 'a_file'), b'')
  with pytest.raises(UsageError, match='cannot write to output directory'):
    convert_in_process(make_raw(str(tmp_path)), str(tmp_path / 'a_file' / 'o'))


def test_changed_shard_count_is_refused(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  _write(os.path.join(out, 'train', 'train-00000-of-00003'), b'')
  with pytest.raises(UsageError, match='--train_shards 3'):
    convert_in_process(raw, out)


# --- End to end, through the real script -----------------------------------


@pytest.mark.processes
def test_converts_tiny_dataset_with_two_workers(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  result = run_script('--raw_data_dir', raw, '--local_scratch_dir', out,
                      '--train_shards', '4', '--validation_shards', '2',
                      '--num_workers', '2')
  assert result.returncode == 0, result.stderr
  assert 'images/sec' in result.stdout and 'done in' in result.stdout

  assert sorted(os.listdir(os.path.join(out, 'train'))) == [
      f'train-{i:05d}-of-00004' for i in range(4)]
  assert sorted(os.listdir(os.path.join(out, 'validation'))) == [
      'validation-00000-of-00002', 'validation-00001-of-00002']
  with open(os.path.join(out, 'labels.txt')) as f:
    assert f.read().splitlines() == SYNSETS
  with open(os.path.join(out, 'metadata.json')) as f:
    metadata = json.load(f)
  assert metadata['num_classes'] == 3
  assert metadata['num_examples'] == {'train': 3 * TRAIN_PER_CLASS,
                                      'validation': NUM_VALIDATION}
  assert metadata['image_format'] == 'JPEG'

  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  train = read_split(out, 'train')
  validation = read_split(out, 'validation')
  assert len(train) == 3 * TRAIN_PER_CLASS
  for _, example in train + validation:
    synset = feature(example, 'image/class/synset')[0].decode()
    assert feature(example, 'image/class/label') == [SYNSETS.index(synset) + 1]
    assert feature(example, 'image/colorspace') == [b'RGB']
    assert feature(example, 'image/channels') == [3]
    assert feature(example, 'image/format') == [b'JPEG']
    pixels = tf.io.decode_jpeg(feature(example, 'image/encoded')[0])
    assert pixels.shape == (feature(example, 'image/height')[0],
                            feature(example, 'image/width')[0], 3)
  train_names = [feature(e, 'image/filename')[0].decode() for _, e in train]
  assert train_names != sorted(train_names)  # shuffled
  assert 'n01440764_0.JPEG' in train_names  # the PNG named .JPEG
  val_names = [feature(e, 'image/filename')[0].decode() for _, e in validation]
  assert val_names == sorted(val_names)
  assert [feature(e, 'image/class/synset')[0].decode()
          for _, e in validation] == [SYNSETS[i % 3]
                                      for i in range(NUM_VALIDATION)]
  # Shards hold near-equal numbers of images.
  per_shard = [name for name, _ in train]
  assert sorted(per_shard.count(n) for n in set(per_shard)) == [5, 5, 5, 6]

  # The trainer reads the converter's output as is: counts from
  # metadata.json, and eval covers all 6 images with batch 4 (4 + 2).
  trained = e2e.run_main(
      ['-dd', out, '-md', str(tmp_path / 'model'), '--resnet_depth=10',
       '--width_multiplier=0.25', '--image_size=32', '-bs', '4',
       '--steps_per_loop=5', '--log_steps=5'])
  assert trained.returncode == 0, trained.stderr[-3000:]
  with open(tmp_path / 'model' / 'run_summary.json') as f:
    summary = json.load(f)
  assert summary['num_classes'] == 3
  assert summary['steps_per_epoch'] == 3 * TRAIN_PER_CLASS // 4
  assert summary['eval_examples'] == NUM_VALIDATION


def test_rgb_jpegs_are_stored_byte_for_byte(tmp_path):
  raw, out = make_raw(str(tmp_path), 'class_folders'), str(tmp_path / 'out')
  convert_in_process(raw, out, train_shards=1, validation_shards=1)
  for _, example in read_split(out, 'validation'):
    synset = feature(example, 'image/class/synset')[0].decode()
    name = feature(example, 'image/filename')[0].decode()
    with open(os.path.join(raw, 'validation', synset, name), 'rb') as f:
      assert feature(example, 'image/encoded')[0] == f.read()


@pytest.mark.processes
def test_fewer_images_than_shards_reduces_the_shard_count(tmp_path):
  raw, out = make_raw(str(tmp_path), 'class_folders'), str(tmp_path / 'out')
  result = run_script('--raw_data_dir', raw, '--local_scratch_dir', out,
                      '--train_shards', '2', '--validation_shards', '100',
                      '--num_workers', '1')
  assert result.returncode == 0, result.stderr
  assert (f'validation: only {NUM_VALIDATION} images, so writing '
          f'{NUM_VALIDATION} shards instead of 100') in result.stdout
  assert len(os.listdir(os.path.join(out, 'validation'))) == NUM_VALIDATION
  with open(os.path.join(out, 'metadata.json')) as f:
    assert json.load(f)['num_examples']['validation'] == NUM_VALIDATION


@pytest.mark.processes
def test_corrupt_image_stops_the_run_or_is_skipped(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  bad = os.path.join(raw, 'train', SYNSETS[2], 'broken.JPEG')
  _write(bad, _encoded(_image(64, 64, 7), 'JPEG')[:700])
  args = ['--raw_data_dir', raw, '--local_scratch_dir', out,
          '--train_shards', '2', '--validation_shards', '1']

  result = run_script(*args)
  assert_one_line_error(result, bad, '--skip_bad_images')
  # The shard holding the bad image never got its final name.
  train_dir = os.path.join(out, 'train')
  finished = [n for n in os.listdir(train_dir) if n.startswith('train-')]
  assert len(finished) < 2
  for name in finished:
    assert pi.count_records(os.path.join(train_dir, name)) > 0

  result = run_script(*args, '--skip_bad_images')
  assert result.returncode == 0, result.stderr
  assert bad in result.stderr
  assert '1 undecodable images skipped' in result.stdout
  with open(os.path.join(out, 'metadata.json')) as f:
    assert json.load(f)['num_examples']['train'] == 3 * TRAIN_PER_CLASS


@pytest.mark.processes
def test_resume_rewrites_only_missing_shards(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  convert_in_process(raw, out)
  train_dir = os.path.join(out, 'train')
  names = sorted(os.listdir(train_dir))
  mtimes = {n: os.stat(os.path.join(train_dir, n)).st_mtime_ns for n in names}
  with open(os.path.join(train_dir, names[2]), 'rb') as f:
    original = f.read()
  # An interrupted run: the shard never got its final name, and its
  # temporary file was left half written.
  os.remove(os.path.join(train_dir, names[2]))
  _write(files.temporary_path(os.path.join(train_dir, names[2])), original[:50])
  os.remove(os.path.join(out, 'metadata.json'))

  result = run_script('--raw_data_dir', raw, '--local_scratch_dir', out,
                      '--train_shards', '4', '--validation_shards', '2')
  assert result.returncode == 0, result.stderr
  assert 'resuming: 5 of 6 shards are already complete' in result.stdout
  assert sorted(os.listdir(train_dir)) == names
  for name in names:
    if name != names[2]:
      assert os.stat(os.path.join(train_dir, name)).st_mtime_ns == mtimes[name]
  with open(os.path.join(train_dir, names[2]), 'rb') as f:
    assert f.read() == original  # same images, same order
  with open(os.path.join(out, 'metadata.json')) as f:
    assert json.load(f)['num_examples'] == {'train': 3 * TRAIN_PER_CLASS,
                                            'validation': NUM_VALIDATION}


@pytest.mark.parametrize('args,fragment', [
    (['--raw_data_dir', '/nonexistent/raw'], '/nonexistent/raw'),
    (['--raw_data_dir', '{raw}', '--train_shards', '0'],
     '--train_shards must be at least 1'),
    (['--raw_data_dir', '{raw}', '--num_workers', 'two'], 'num_workers'),
    (['--raw_data_dir', '{raw}', 'extra'], 'unexpected arguments extra'),
    (['--raw_data_dir', '{raw}', '--gcs_upload'], 'gsutil'),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, fragment):
  raw = make_raw(str(tmp_path))
  args = [a.format(raw=raw) for a in args]
  result = run_script(*args, '--local_scratch_dir', str(tmp_path / 'out'))
  assert_one_line_error(result, fragment)


@pytest.mark.processes
def test_reference_command_line_converts_its_raw_layout(tmp_path):
  """The reference's README steps: img_train/, img_val/, synset_labels.txt in
  IMAGENET_HOME, records to IMAGENET_HOME/tf_records, --nogcs_upload."""
  home = make_raw(str(tmp_path))
  _reference_layout(home)
  out = os.path.join(home, 'tf_records')
  result = run_script(f'--raw_data_dir={home}', f'--local_scratch_dir={out}',
                      '--nogcs_upload', '--train_shards=2',
                      '--validation_shards=1', '--num_workers=1')
  assert result.returncode == 0, result.stderr
  train, validation = read_split(out, 'train'), read_split(out, 'validation')
  assert len(train) == 3 * TRAIN_PER_CLASS
  assert [feature(e, 'image/class/label')[0] for _, e in validation] == [
      i % 3 + 1 for i in range(NUM_VALIDATION)]
