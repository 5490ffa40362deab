"""Training input pipeline alone: ours vs the Model Garden's, same shards.

Writes a set of real-looking JPEG shards (random-texture images of ImageNet
size, or uses --data_dir), then measures images/sec of
`resnet_keras.data.imagenet.dataset` and of the Model Garden's
`imagenet_preprocessing.input_fn` on the same files, alternately, and prints
the medians and the ratio. Compare with the trainer's img/s: the pipeline
should deliver at least twice what training consumes. Ours with a seed
(--global_seed: deterministic order, stateless augmentation) runs too, to
show what reproducibility costs, ours on a private threadpool of the
machine's cores (--datasets_num_private_threads), and ours delivering uint8
pixels (--data_loader_image_type=uint8, the mean subtracted on the device).
Then each side's per-image preprocessing alone: the same cached records
through its parse-and-augment function on one thread, which separates op
cost from tf.data scheduling.

  python -m benchmarks.input_pipeline [--data_dir DIR] [--image_size 224]
"""

import argparse
import os
import statistics
import tempfile
import time


from common import cli  # pylint: disable=g-import-not-at-top
from common import env  # pylint: disable=g-import-not-at-top

env.prepare_tensorflow_environment()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from official.legacy.image_classification.resnet import imagenet_preprocessing  # pylint: disable=g-import-not-at-top

from benchmarks import hardware  # pylint: disable=g-import-not-at-top
from resnet_keras.data import imagenet  # pylint: disable=g-import-not-at-top
from resnet_keras.data import imagenet_record  # pylint: disable=g-import-not-at-top
from resnet_keras.data.preprocessing import augmentation_seed  # pylint: disable=g-import-not-at-top


def write_shards(folder, num_shards, per_shard, seed=0):
  """JPEGs of ImageNet's typical size (~400x350) with real texture."""
  rng = np.random.RandomState(seed)
  os.makedirs(os.path.join(folder, 'train'), exist_ok=True)
  files = []
  for shard in range(num_shards):
    path = os.path.join(folder, 'train',
                        f'train-{shard:05d}-of-{num_shards:05d}')
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(per_shard):
        h, w = rng.randint(300, 500), rng.randint(300, 500)
        small = rng.randint(0, 256, [h // 8, w // 8, 3]).astype(np.uint8)
        pixels = tf.image.resize(small, [h, w]).numpy().astype(np.uint8)
        jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
        label = int(rng.randint(1, 1001))
        writer.write(imagenet_record.encode(
            jpeg, label, h, w, synset=f'n{label:08d}',
            filename=f'{shard}_{i}.JPEG'))
    files.append(path)
  return files


def images_per_second(ds, batch_size, warmup_batches, batches):
  it = iter(ds)
  for _ in range(warmup_batches):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * batch_size / (time.perf_counter() - start)


def ours(files, args, seed=None, num_private_threads=0, dtype=tf.bfloat16):
  return imagenet.dataset(files, is_training=True, batch_size=args.batch_size,
                          image_size=args.image_size, dtype=dtype,
                          num_classes=1000, seed=seed,
                          num_private_threads=num_private_threads)


def ours_seeded(files, args):
  return ours(files, args, seed=1)


def ours_private_threads(files, args):
  """--datasets_num_private_threads set to the machine's cores."""
  return ours(files, args, num_private_threads=os.cpu_count())


def ours_uint8(files, args):
  """--data_loader_image_type=uint8: normalisation moves to the device."""
  return ours(files, args, dtype=tf.uint8)


def model_garden(files, args):
  del args.image_size  # Fixed at 224 upstream.
  return imagenet_preprocessing.input_fn(
      is_training=True, data_dir=None, batch_size=args.batch_size,
      dtype=tf.bfloat16, drop_remainder=True, filenames=files)


def per_image_ms(files, repeats, num_records=400):
  """Median ms per image of each side's training preprocessing, one thread."""
  records = list(tf.data.TFRecordDataset(files).take(num_records)
                 .as_numpy_iterator())
  # Warm-up calls, then the timed ones: a small data set still times some.
  warmup = min(10, len(records) // 2)
  if len(records) < 2:
    cli.fail(f'{len(records)} training record(s) in --data_dir: the '
             'per-image timing needs 2 or more')
  cached = tf.data.Dataset.from_tensor_slices(records).enumerate()

  def ours_fn(dtype):
    def fn(position, record):
      image_bytes, label, boxes = imagenet_record.parse(record)
      return imagenet.preprocess_train(
          image_bytes, boxes, 224, dtype, augmentation_seed(None, position),
          augmentation_seed(None, position, 1)), label
    return fn

  def model_garden_fn(_, record):
    return imagenet_preprocessing.parse_record(record, True, tf.bfloat16)

  one_thread = tf.data.Options()
  one_thread.threading.private_threadpool_size = 1
  fns = {'ours': ours_fn(tf.bfloat16), 'model_garden': model_garden_fn,
         'ours_uint8': ours_fn(tf.uint8)}
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      it = iter(cached.map(fn).with_options(one_thread))
      for _ in range(warmup):
        next(it)
      start = time.perf_counter()
      count = sum(1 for _ in it)
      times[name].append((time.perf_counter() - start) / count * 1e3)
  return {name: statistics.median(t) for name, t in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data_dir', help='Existing TFRecords (train split).')
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--batches', type=int, default=30)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  args.image_size = 224
  print(hardware.machine_line())
  with tempfile.TemporaryDirectory() as tmp:
    if args.data_dir:
      files = imagenet.find_shards(args.data_dir, 'train')
    else:
      files = write_shards(tmp, num_shards=8, per_shard=128)
    print(f'{len(files)} shards, batch {args.batch_size}, bf16 224x224, '
          f'{args.batches} batches per measurement after 5 warm-up batches')
    builders = {'ours': ours, 'model_garden': model_garden,
                'ours_seeded': ours_seeded,
                'ours_private_threads': ours_private_threads,
                'ours_uint8': ours_uint8}
    rates = {name: [] for name in builders}
    for _ in range(args.repeats):
      for name, build in builders.items():
        build_args = argparse.Namespace(**vars(args))
        rates[name].append(images_per_second(build(files, build_args),
                                             args.batch_size, 5, args.batches))
    median = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
      print(f'{name:<21} {median[name]:8.1f} images/sec   '
            f'{[round(x) for x in r]}')
    print(f'ratio ours/model garden: '
          f'{median["ours"] / median["model_garden"]:.2f}; seeded/unseeded: '
          f'{median["ours_seeded"] / median["ours"]:.2f}; private '
          f'threads/shared pool: '
          f'{median["ours_private_threads"] / median["ours"]:.2f}; uint8/bf16 '
          f'loader: {median["ours_uint8"] / median["ours"]:.2f}')
    ms = per_image_ms(files, args.repeats)
    print(f'per image, one thread: ours {ms["ours"]:.3f} ms, model garden '
          f'{ms["model_garden"]:.3f} ms, ours uint8 {ms["ours_uint8"]:.3f} ms')


if __name__ == '__main__':
  main()
