"""The converter of raw ImageNet-style JPEG folders to ImageNet TFRecords
(the command line: preprocess_imagenet.py, whose docstring gives the
layouts read and written).

`convert` lists the raw tree (`list_train`, `list_validation`), shuffles the
training images with a fixed seed, plans the shards (`plan_shards`) and
writes those not yet complete in worker processes (`run_tasks`,
`write_shard`), each image decoded (`encode_image`) and stored as the
record imagenet_record.py defines, which the trainer reads (imagenet.py);
then labels.txt and metadata.json.
"""

import concurrent.futures
import io
import json
import multiprocessing
import os
import random
import re
import signal
import sys
import tempfile
import time
import unicodedata
from typing import NamedTuple

from PIL import Image

from resnet_keras import files
from common.errors import RunStopped, UsageError

# TensorFlow is imported only where shards are written (write_shard): it
# takes seconds, and bad input should be reported at once.

IMAGE_EXTENSIONS = ('.jpeg', '.jpg', '.png')
_IMAGE_KINDS = '.JPEG, .jpg, .jpeg or .png, any case'
SPLITS = ('train', 'validation')
# Raw split folders: the names TensorFlow's imagenet_to_gcs.py reads, or the
# reference's (its extraction steps untar into img_train/ and img_val/).
RAW_SPLIT_DIRS = {'train': ('train', 'img_train'),
                  'validation': ('validation', 'img_val')}
# Fixed, so that a resumed run assigns the same images to the same shards.
TRAIN_SHUFFLE_SEED = 12345
JPEG_QUALITY = 95
PROGRESS_INTERVAL_SECS = 10.0


class RawImage(NamedTuple):
  path: str
  synset: str
  label: int  # 1-based


class ShardTask(NamedTuple):
  path: str  # final file name of the shard
  images: list
  skip_bad_images: bool


class ShardResult(NamedTuple):
  path: str
  num_written: int
  skipped: list  # (path, reason) of images that could not be decoded


class BadImageError(Exception):
  """An image file that cannot be read or decoded."""


# ---------------------------------------------------------------------------
# Listing the raw tree.


def _entries(directory, kind):
  """The names of the entries of `directory` that are of `kind` ('file' or
  'dir', links followed), but hidden ones. An entry that cannot be told (a
  symbolic link that loops, one into a folder not readable) is refused in
  one line: skipped, it would leave a class or its images out unsaid."""
  try:
    with os.scandir(directory) as entries:
      return [e.name for e in entries if not e.name.startswith('.') and
              (e.is_file() if kind == 'file' else e.is_dir())]
  except OSError as e:
    raise UsageError(f'{e.filename or directory} cannot be read ({e.strerror}'
                     '); fix or remove it (a symbolic link that loops?)'
                     ) from None


def _image_files(directory):
  """Sorted paths of the image files directly inside `directory`."""
  # Hidden files are skipped: macOS leaves '._x.JPEG' metadata files behind.
  names = [name for name in _entries(directory, 'file')
           if name.lower().endswith(IMAGE_EXTENSIONS)]
  return [os.path.join(directory, name) for name in sorted(names)]


def _class_folders(directory):
  return sorted(_entries(directory, 'dir'))


def _check_class_name(folder):
  """Refuses a class folder whose name labels.txt cannot hold as one line
  of its own, read back as it was written (imagenet.read_labels strips
  each line and skips blank ones): a newline or another control character
  in it, a line or paragraph separator, or blanks at either end would
  shift or rename every class after it."""
  name = os.path.basename(folder)
  bad = [c for c in name if unicodedata.category(c) in ('Cc', 'Zl', 'Zp')]
  if bad or name != name.strip():
    what = (f'a control character ({bad[0]!r})' if bad else
            'a blank at its start or end')
    raise UsageError(f'class folder {folder!r} has {what} in its name, which '
                     'labels.txt (one class name a line) cannot hold; rename '
                     'the folder')


def raw_split_dir(raw_dir, split, what):
  """R/<split folder>, under whichever of its accepted names exists."""
  candidates = [os.path.join(raw_dir, name) for name in RAW_SPLIT_DIRS[split]]
  found = [path for path in candidates if os.path.isdir(path)]
  if len(found) > 1:
    raise UsageError(f'both {found[0]} and {found[1]} exist; keep one of them '
                     f'for the {split} images')
  if not found:
    raise UsageError(f'neither {candidates[0]} nor {candidates[1]} is a '
                     f'directory; expected {what}')
  return found[0]


def label_map(synsets):
  """synset -> label: 1 + its index in the sorted training synsets."""
  return {synset: i + 1 for i, synset in enumerate(synsets)}


def list_class_folder_images(split_dir, synsets, labels):
  """Images of `split_dir/<synset>/` for each synset, labelled via `labels`."""
  images = []
  for synset in synsets:
    folder = os.path.join(split_dir, synset)
    if synset not in labels:
      raise UsageError(f'{folder} is not a training class (the training '
                       f'images have no folder {synset}); rename or remove it')
    files = _image_files(folder)
    if not files:
      raise UsageError(f'class folder {folder} has no images '
                       f'({_IMAGE_KINDS}); add some or remove it')
    images.extend(RawImage(f, synset, labels[synset]) for f in files)
  return images


def list_train(raw_dir):
  """Returns (synsets in label order, training images)."""
  train_dir = raw_split_dir(raw_dir, 'train',
                            'one folder of images per class in it')
  synsets = _class_folders(train_dir)
  if not synsets:
    raise UsageError(f'{train_dir} has no class folders; expected '
                     f'{train_dir}/<synset>/*.JPEG')
  for synset in synsets:
    _check_class_name(os.path.join(train_dir, synset))
  return synsets, list_class_folder_images(train_dir, synsets,
                                          label_map(synsets))


def list_validation(raw_dir, synsets):
  """Validation images, from synset_labels.txt or from class folders."""
  val_dir = raw_split_dir(raw_dir, 'validation', 'the validation images in it')
  labels = label_map(synsets)
  labels_file = os.path.join(raw_dir, 'synset_labels.txt')
  if not os.path.isfile(labels_file):
    folders = _class_folders(val_dir)
    if not folders:
      raise UsageError(f'{val_dir} has no class folders and {labels_file} '
                       'does not exist; provide one of the two')
    return list_class_folder_images(val_dir, folders, labels)

  files = _image_files(val_dir)
  if not files:
    raise UsageError(f'{val_dir} has no images ({_IMAGE_KINDS}) for the '
                     f'synsets in {labels_file}')
  with open(labels_file, encoding='utf-8') as f:
    val_synsets = f.read().split()
  if len(val_synsets) != len(files):
    raise UsageError(f'{labels_file} has {len(val_synsets)} synsets but '
                     f'{val_dir} has {len(files)} images; it needs one synset '
                     'per image, in sorted filename order')
  for line, synset in enumerate(val_synsets, 1):
    if synset not in labels:
      raise UsageError(f'{labels_file} line {line}: {synset} is not a '
                       'training class (the training images have no such '
                       'folder)')
  return [RawImage(f, s, labels[s]) for f, s in zip(files, val_synsets)]


# ---------------------------------------------------------------------------
# Sharding plan.


def shuffled(images, seed=TRAIN_SHUFFLE_SEED):
  out = list(images)
  random.Random(seed).shuffle(out)
  return out


def effective_num_shards(num_images, requested):
  """`requested`, unless that would leave some shard without an image."""
  return min(requested, num_images)


def plan_shards(images, num_shards):
  """Splits `images` into `num_shards` contiguous runs of near-equal size."""
  n = len(images)
  return [images[i * n // num_shards:(i + 1) * n // num_shards]
          for i in range(num_shards)]


def shard_name(split, index, num_shards):
  return f'{split}-{index:05d}-of-{num_shards:05d}'


def check_existing_shards(split_dir, split, num_shards):
  """Refuses to mix shards of different shard counts in one directory."""
  pattern = re.compile(rf'{re.escape(split)}-\d{{5}}-of-(\d{{5}})')
  for name in sorted(os.listdir(split_dir)):
    match = pattern.fullmatch(name)
    if match and int(match.group(1)) != num_shards:
      other = int(match.group(1))
      raise UsageError(
          f'{split_dir} holds shards of a {other}-shard conversion but this '
          f'run writes {num_shards}; pass --{split}_shards {other} to resume '
          'it, or remove those shards')


# ---------------------------------------------------------------------------
# Encoding and writing.


def encode_image(data):
  """Returns (RGB JPEG bytes, height, width) for the image file content.

  Raises BadImageError when the data cannot be decoded.
  """
  try:
    with Image.open(io.BytesIO(data)) as image:
      # Decode every pixel: a truncated file must fail here, not in training.
      image.load()
      if image.format == 'JPEG' and image.mode == 'RGB':
        return data, image.height, image.width
      rgb = image.convert('RGB')
  except Image.UnidentifiedImageError:
    raise BadImageError('not an image format Pillow can read') from None
  # Pillow reports malformed data with many exception types (OSError,
  # SyntaxError, ValueError, struct.error, DecompressionBombError, ...).
  except Exception as e:  # pylint: disable=broad-except
    raise BadImageError(str(e) or type(e).__name__) from None
  out = io.BytesIO()
  rgb.save(out, format='JPEG', quality=JPEG_QUALITY)
  return out.getvalue(), rgb.height, rgb.width


def _read_and_encode(path):
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except OSError as e:
    raise BadImageError(f'cannot read it: {e.strerror}') from None
  return encode_image(data)


def _fsync(path):
  # Without it a crash soon after the rename could leave a short file under
  # the final name, which a rerun would take as complete.
  with open(path, 'rb') as f:
    os.fsync(f.fileno())


def write_shard(task):
  """Writes one shard under a temporary name, then renames it into place."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  from resnet_keras.data import imagenet_record
  # pylint: enable=import-outside-toplevel
  tmp = files.temporary_path(task.path)
  skipped = []
  try:
    with tf.io.TFRecordWriter(tmp) as writer:
      for image in task.images:
        try:
          jpeg, height, width = _read_and_encode(image.path)
        except BadImageError as e:
          if not task.skip_bad_images:
            raise UsageError(
                f'cannot decode {image.path} ({e}); fix or remove it, or pass '
                '--skip_bad_images to skip undecodable images') from None
          skipped.append((image.path, str(e)))
          continue
        writer.write(imagenet_record.encode(
            jpeg, image.label, height, width, image.synset,
            os.path.basename(image.path)))
    _fsync(tmp)
    os.replace(tmp, task.path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return ShardResult(task.path, len(task.images) - len(skipped), skipped)


def count_records(path):
  """Number of records in a TFRecord file, read from the length headers."""
  count = 0
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
    offset = 0
    while offset < size:
      header = f.read(8)
      # Each record: uint64 length, uint32 length crc, data, uint32 data crc.
      offset += 12 + int.from_bytes(header, 'little') + 4
      if len(header) < 8 or offset > size:
        raise UsageError(f'{path} is truncated; delete it and rerun to '
                         'rewrite it')
      f.seek(offset)
      count += 1
  return count


def prepare_output_dir(out_dir):
  try:
    os.makedirs(out_dir, exist_ok=True)
    for split in SPLITS:
      os.makedirs(os.path.join(out_dir, split), exist_ok=True)
    # Root ignores permission bits, so only an actual write tells.
    with tempfile.TemporaryFile(dir=out_dir):
      pass
  except OSError as e:
    raise UsageError(f'cannot write to output directory {out_dir} '
                     f'({e.strerror}); pass a writable --local_scratch_dir'
                     ) from None


# ---------------------------------------------------------------------------
# Running the conversion.


def format_progress(shards_done, total_shards, images_done, total_images,
                    seconds):
  rate = images_done / seconds if seconds > 0 else 0.0
  eta = (total_images - images_done) / rate if rate > 0 else 0.0
  return (f'{shards_done}/{total_shards} shards, '
          f'{images_done}/{total_images} images, {rate:.1f} images/sec, '
          f'ETA {eta:.0f}s')


def _ignore_sigint():
  # Ctrl-C is the parent's to handle: it stops the pool and says how to
  # resume, instead of every worker printing a traceback.
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_tasks(tasks, num_workers):
  """Writes the shards of `tasks` in worker processes; returns the results."""
  if not tasks:
    return []
  total_images = sum(len(t.images) for t in tasks)
  images_done = 0
  results = []
  start = last_report = time.monotonic()
  # Fresh interpreters, not forks: this process may have imported
  # TensorFlow, whose threads can hold a lock at the moment of a fork, which
  # the child then waits for forever (seen once: the test suite's
  # conversion of a corrupt image hung silently, on a loaded machine). Each
  # worker imports TensorFlow itself once (2-3 s), then writes many shards.
  # concurrent.futures, not multiprocessing.Pool: a worker that dies ends
  # the run (BrokenProcessPool) where Pool waits forever, and stopping after
  # an error does not go through Pool.terminate, which hung once more in
  # the suite (2026-11-27) with its workers already gone. On an error or
  # Ctrl-C the shards in flight finish; the queued ones are cancelled.
  context = multiprocessing.get_context('spawn')
  executor = concurrent.futures.ProcessPoolExecutor(
      min(num_workers, len(tasks)), mp_context=context,
      initializer=_ignore_sigint)
  try:
    futures = [executor.submit(write_shard, task) for task in tasks]
    for future in concurrent.futures.as_completed(futures):
      result = future.result()
      results.append(result)
      images_done += result.num_written + len(result.skipped)
      for path, reason in result.skipped:
        print(f'warning: skipped undecodable image {path} ({reason})',
              file=sys.stderr)
      now = time.monotonic()
      if (now - last_report >= PROGRESS_INTERVAL_SECS
          or len(results) == len(tasks)):
        print(format_progress(len(results), len(tasks), images_done,
                              total_images, now - start), flush=True)
        last_report = now
  except concurrent.futures.process.BrokenProcessPool:
    raise RunStopped('a converter worker process died (killed, or out of '
                     'memory?); complete shards are kept, rerun the same '
                     'command to write the rest', 1) from None
  finally:
    # Not the executor's `with`: its exit waits for the queued shards too.
    executor.shutdown(wait=True, cancel_futures=True)
  return results


def convert(raw_dir, out_dir, num_shards, num_workers, skip_bad_images,
            upload=False):
  """Converts all splits; `num_shards` maps split -> requested shard count.

  Returns the metadata dict that was written to OUT/metadata.json.
  """
  start = time.monotonic()
  for split, requested in num_shards.items():
    if requested < 1:
      raise UsageError(f'--{split}_shards must be at least 1, got {requested}')
  if num_workers < 1:
    raise UsageError(f'--num_workers must be at least 1, got {num_workers}')
  if not raw_dir:
    raise UsageError('pass --raw_data_dir, the directory with train/ and '
                     'validation/')
  if not out_dir:
    raise UsageError('pass --local_scratch_dir, the output directory')
  if upload:
    raise UsageError('--gcs_upload is not supported: convert to '
                     '--local_scratch_dir, then copy it with gsutil -m cp -r')
  if not os.path.isdir(raw_dir):
    raise UsageError(f'--raw_data_dir={raw_dir} {files.kind_of(raw_dir)}; '
                     'give the directory with train/ and validation/')

  synsets, train = list_train(raw_dir)
  images = {'train': shuffled(train),
            'validation': list_validation(raw_dir, synsets)}
  prepare_output_dir(out_dir)
  files.write_text_atomically(os.path.join(out_dir, 'labels.txt'),
                        ''.join(f'{s}\n' for s in synsets))

  tasks = []
  shard_paths = {}
  for split in SPLITS:
    count = effective_num_shards(len(images[split]), num_shards[split])
    if count < num_shards[split]:
      print(f'{split}: only {count} images, so writing {count} shards instead '
            f'of {num_shards[split]}')
    split_dir = os.path.join(out_dir, split)
    check_existing_shards(split_dir, split, count)
    shard_paths[split] = []
    for i, shard in enumerate(plan_shards(images[split], count)):
      path = os.path.join(split_dir, shard_name(split, i, count))
      shard_paths[split].append(path)
      if not os.path.exists(path):
        tasks.append(ShardTask(path, shard, skip_bad_images))
  total_shards = sum(len(p) for p in shard_paths.values())
  if len(tasks) < total_shards:
    print(f'resuming: {total_shards - len(tasks)} of {total_shards} shards '
          'are already complete')

  results = run_tasks(tasks, num_workers)

  metadata = {
      'num_classes': len(synsets),
      'num_examples': {split: sum(count_records(p) for p in paths)
                       for split, paths in shard_paths.items()},
      'num_shards': {split: len(paths) for split, paths in shard_paths.items()},
      'image_format': 'JPEG',
  }
  files.write_text_atomically(os.path.join(out_dir, 'metadata.json'),
                        json.dumps(metadata, indent=2) + '\n')
  skipped = sum(len(r.skipped) for r in results)
  counts = ', '.join(f'{split} {n} images in {metadata["num_shards"][split]} '
                     'shards' for split, n in metadata['num_examples'].items())
  print(f'done in {time.monotonic() - start:.1f}s: {counts}; '
        f'{len(tasks)} shards written now, {skipped} undecodable images '
        f'skipped; {len(synsets)} classes; output in {out_dir}')
  return metadata
