"""preprocess_imagenet.py as users run it, converting a tiny raw tree built
with Pillow (support/converter.py) in worker processes: the records, what
the trainer reads of them, shard counts, corrupt images, resumes, the
reference's command line."""

import json
import os

import pytest

from resnet_keras.data import imagenet_converter
from resnet_keras import files
from common.errors import RunStopped
from tests.support import runner
from tests.support.converter import (NUM_VALIDATION, SYNSETS, TRAIN_PER_CLASS,
                                     assert_one_line_error, convert_in_process,
                                     encoded, feature, make_raw, pil_image,
                                     read_split, reference_layout, run_script,
                                     write_bytes)

# --- End to end, through the real script -----------------------------------


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
  trained = runner.run_main(
      ['-dd', out, '-md', str(tmp_path / 'model'), '--resnet_depth=10',
       '--width_multiplier=0.25', '--image_size=32', '-bs', '4',
       '--steps_per_loop=5', '--log_steps=5'])
  assert trained.returncode == 0, trained.stderr[-3000:]
  with open(tmp_path / 'model' / 'run_summary.json') as f:
    summary = json.load(f)
  assert summary['num_classes'] == 3
  assert summary['steps_per_epoch'] == 3 * TRAIN_PER_CLASS // 4
  assert summary['eval_examples'] == NUM_VALIDATION


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


def test_corrupt_image_stops_the_run_or_is_skipped(tmp_path):
  raw, out = make_raw(str(tmp_path)), str(tmp_path / 'out')
  bad = os.path.join(raw, 'train', SYNSETS[2], 'broken.JPEG')
  write_bytes(bad, encoded(pil_image(64, 64, 7), 'JPEG')[:700])
  args = ['--raw_data_dir', raw, '--local_scratch_dir', out,
          '--train_shards', '2', '--validation_shards', '1']

  result = run_script(*args)
  assert_one_line_error(result, bad, '--skip_bad_images')
  # The shard holding the bad image never got its final name.
  train_dir = os.path.join(out, 'train')
  finished = [n for n in os.listdir(train_dir) if n.startswith('train-')]
  assert len(finished) < 2
  for name in finished:
    assert imagenet_converter.count_records(os.path.join(train_dir, name)) > 0

  result = run_script(*args, '--skip_bad_images')
  assert result.returncode == 0, result.stderr
  assert bad in result.stderr
  assert '1 undecodable images skipped' in result.stdout
  with open(os.path.join(out, 'metadata.json')) as f:
    assert json.load(f)['num_examples']['train'] == 3 * TRAIN_PER_CLASS


class _EndsTheProcessWhenUnpickled:
  """A shard task's image that kills the worker receiving it, as the OOM
  killer would."""

  def __reduce__(self):
    return (os._exit, (9,))


def test_a_worker_that_dies_ends_the_run_in_one_line(tmp_path):
  # multiprocessing.Pool waited forever for such a worker's shard.
  task = imagenet_converter.ShardTask(
      str(tmp_path / 'train-00000-of-00002'),
      [_EndsTheProcessWhenUnpickled()], False)
  with pytest.raises(RunStopped, match='converter worker process died'):
    imagenet_converter.run_tasks(
        [task, task._replace(path=str(tmp_path / 'other'))], 2)
  assert not os.listdir(tmp_path)


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
  write_bytes(files.temporary_path(os.path.join(train_dir, names[2])),
              original[:50])
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


def test_reference_command_line_converts_its_raw_layout(tmp_path):
  """The reference's README steps: img_train/, img_val/, synset_labels.txt in
  IMAGENET_HOME, records to IMAGENET_HOME/tf_records, --nogcs_upload."""
  home = make_raw(str(tmp_path))
  reference_layout(home)
  out = os.path.join(home, 'tf_records')
  result = run_script(f'--raw_data_dir={home}', f'--local_scratch_dir={out}',
                      '--nogcs_upload', '--train_shards=2',
                      '--validation_shards=1', '--num_workers=1')
  assert result.returncode == 0, result.stderr
  train, validation = read_split(out, 'train'), read_split(out, 'validation')
  assert len(train) == 3 * TRAIN_PER_CLASS
  assert [feature(e, 'image/class/label')[0] for _, e in validation] == [
      i % 3 + 1 for i in range(NUM_VALIDATION)]
