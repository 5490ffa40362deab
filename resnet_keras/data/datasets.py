"""Which dataset a run reads, how big it is, and its per-replica pipelines.

Everything the trainer needs to know about data goes through `describe`
(class and example counts, so step arithmetic never hard-codes ImageNet) and
`make_input_fns` (per-replica `tf.data` pipelines for tf.distribute's
`distribute_datasets_from_function`); a data error's known causes become
one line through `errors_named`.
"""

import contextlib
import dataclasses
import functools
from typing import Callable, Iterator, Optional, Tuple

from absl import logging
import tensorflow as tf

from resnet_keras.config import RunConfig
from resnet_keras.config.randaugment_spec import parse_randaugment
from resnet_keras.data import augment
from resnet_keras.data import cifar
from resnet_keras.data import imagenet
from resnet_keras.data import synthetic
from resnet_keras.data.preprocessing import normalize_images
from common.errors import UsageError

LOADER_DTYPES = {'fp32': tf.float32, 'bf16': tf.bfloat16, 'uint8': tf.uint8}
# ImageNet-1k, used for synthetic data so its step counts match real runs.
IMAGENET_NUM_CLASSES = 1000
IMAGENET_NUM_TRAIN_EXAMPLES = 1281167
IMAGENET_NUM_EVAL_EXAMPLES = 50000


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  name: str
  # Files found by `describe`, so input fns never search again.
  train_files: Tuple[str, ...] = ()
  eval_files: Tuple[str, ...] = ()


def loader_dtype(cfg: RunConfig) -> tf.DType:
  return LOADER_DTYPES[cfg.data_loader_image_type]


def pipeline_output(cfg: RunConfig) -> Tuple[tf.DType, Optional[Callable]]:
  """What the training model takes from the pipeline (network.build_models):
  the images' dtype, and the normalisation left to the device, which uint8
  images need (else None: the pipeline normalised them)."""
  dtype = loader_dtype(cfg)
  return dtype, normalize_images if dtype == tf.uint8 else None


def describe(cfg: RunConfig) -> DatasetInfo:
  """Class and example counts of the data the flags select."""
  if cfg.use_synthetic_data:
    return DatasetInfo(
        num_classes=cfg.num_classes or IMAGENET_NUM_CLASSES,
        num_train_examples=(cfg.num_train_examples or
                            IMAGENET_NUM_TRAIN_EXAMPLES),
        num_eval_examples=(cfg.num_eval_examples or
                           IMAGENET_NUM_EVAL_EXAMPLES),
        name='synthetic')
  if cfg.dataset in cifar.SPECS:
    train_files, eval_files = (
        cifar.find_files(cfg.data_dir, cfg.dataset, split)
        for split in ('train', 'validation'))
    sizes = {
        'num_classes': cifar.SPECS[cfg.dataset]['num_classes'],
        'num_train_examples': cifar.count_examples(train_files, cfg.dataset),
        'num_eval_examples': cifar.count_examples(eval_files, cfg.dataset)}
  else:
    train_files, eval_files = (imagenet.find_shards(cfg.data_dir, split)
                               for split in ('train', 'validation'))
    sizes = imagenet.describe(cfg.data_dir, train_files, eval_files,
                              cfg.skip_corrupt_records)
  num_classes = cfg.num_classes or sizes['num_classes']
  if num_classes < sizes['num_classes']:
    raise UsageError(
        f'--num_classes={num_classes} but the data in {cfg.data_dir} has '
        f'{sizes["num_classes"]} classes; use 0 to take it from the data')
  return DatasetInfo(
      num_classes=num_classes,
      num_train_examples=_limited(sizes['num_train_examples'],
                                  cfg.num_train_examples),
      num_eval_examples=_limited(sizes['num_eval_examples'],
                                 cfg.num_eval_examples),
      name=f'{cfg.dataset} in {cfg.data_dir}',
      train_files=tuple(train_files), eval_files=tuple(eval_files))


def image_augmentation(cfg: RunConfig) -> augment.ImageAugmentation:
  """What each training image gets after its crop and flip."""
  return augment.ImageAugmentation(
      randaugment=parse_randaugment(cfg.randaugment),
      erasing_prob=cfg.random_erasing, erasing_mode=cfg.random_erasing_mode)


def batch_mixing(cfg: RunConfig, num_classes: int) -> augment.BatchMixing:
  """Mixup/CutMix of each training batch (label smoothing goes inside its
  targets)."""
  return augment.BatchMixing(
      mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha,
      prob=cfg.mix_prob, switch_prob=cfg.mix_switch_prob,
      label_smoothing=cfg.label_smoothing, num_classes=num_classes)


def eval_crop_fraction(cfg: RunConfig) -> float:
  """The central fraction evaluation keeps of an image's short side."""
  # CIFAR evaluation resizes whole (square) images.
  return 1.0 if cfg.dataset in cifar.SPECS else cfg.eval_crop_fraction


def labels_file(cfg: RunConfig) -> Optional[str]:
  """The class names of the data (the converter's labels.txt), if any."""
  if not _reads_tfrecords(cfg):
    return None
  return imagenet.find_labels(cfg.data_dir)


def _limited(available: int, requested: int) -> int:
  return min(available, requested) if requested else available


InputFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


def _reads_tfrecords(cfg: RunConfig) -> bool:
  return not cfg.use_synthetic_data and cfg.dataset not in cifar.SPECS


def skipped_records_counter(cfg: RunConfig
                            ) -> Optional[imagenet.SkippedRecords]:
  """The counter --skip_corrupt_records needs (TFRecord data only)."""
  if cfg.skip_corrupt_records and _reads_tfrecords(cfg):
    return imagenet.SkippedRecords()
  return None


@contextlib.contextmanager
def errors_named(cfg: RunConfig, info: DatasetInfo) -> Iterator[None]:
  """A data error the block raises becomes a one-line UsageError where its
  cause is known: a label outside the classes, or a corrupt shard (named);
  any other goes on as it is."""
  try:
    yield
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    error = _data_error(cfg, info, e)
    if error is None:
      raise
    raise error from None


def _data_error(cfg: RunConfig, info: DatasetInfo,
                error: tf.errors.OpError) -> Optional[UsageError]:
  """The one-line error for a data error, if it has a known cause."""
  if 'label out of range' in error.message:
    return UsageError(f'a record in --data_dir={cfg.data_dir} has a label '
                      f'outside 1..{info.num_classes}; fix the records or '
                      'their metadata.json, or raise --num_classes')
  logging.info('data error (%s); looking for the corrupt file',
               error.message.strip().splitlines()[0][:200])
  message = _corrupt_data_message(cfg, info)
  return UsageError(message) if message else None


def _corrupt_data_message(cfg: RunConfig,
                          info: DatasetInfo) -> Optional[str]:
  """After a data error: one line naming the corrupt shard, if one is."""
  if not _reads_tfrecords(cfg):
    return None
  found = imagenet.find_corrupt_file(list(info.eval_files) +
                                     list(info.train_files))
  if not found:
    return None
  path, reason = found
  return (f'corrupt record in {path} ({reason}); regenerate that file, or '
          'rerun with --skip_corrupt_records to skip bad records')


def make_input_fns(cfg: RunConfig, info: DatasetInfo, replica_batch_size: int,
                   skipped: Optional[imagenet.SkippedRecords] = None,
                   start_step: int = 0) -> Tuple[InputFn, InputFn]:
  """(train_input_fn, eval_input_fn), each taking a tf.distribute context
  and batching `replica_batch_size` examples (TrainingPlan's) per replica.

  `skipped` (from skipped_records_counter) makes TFRecord pipelines skip
  corrupt records and count them. With --global_seed, training input starts
  where `start_step` steps of an earlier run left it (exact resume)."""
  dtype = loader_dtype(cfg)
  seed = cfg.global_seed or 0
  mixing = batch_mixing(cfg, info.num_classes)
  if not cfg.use_synthetic_data:
    pipeline = dict(cache=cfg.training_dataset_cache,
                    num_private_threads=cfg.datasets_num_private_threads,
                    augmentation=image_augmentation(cfg), mixing=mixing,
                    repeats=cfg.repeated_augmentation)
    if cfg.dataset in cifar.SPECS:
      build = functools.partial(cifar.dataset, name=cfg.dataset, **pipeline)
    else:
      build = functools.partial(
          imagenet.dataset, num_classes=info.num_classes,
          crop_min_area=cfg.train_crop_min_area,
          eval_crop_fraction=cfg.eval_crop_fraction, skipped=skipped,
          **pipeline)
    return _file_input_fns(cfg, info, replica_batch_size, dtype, build,
                           start_step if cfg.global_seed is not None else 0)

  if cfg.augments_images:  # Once: input fns are made per size and split.
    logging.log_first_n(
        logging.WARNING, '--use_synthetic_data: --randaugment and '
        '--random_erasing apply to real images only (synthetic batches '
        'measure the device alone); mixing still does', 1)

  def train_input_fn(ctx: tf.distribute.InputContext):
    return synthetic.train_dataset(replica_batch_size, cfg.image_size,
                                   info.num_classes, dtype,
                                   seed=seed + ctx.input_pipeline_id,
                                   mixing=mixing)

  def eval_input_fn(ctx: tf.distribute.InputContext):
    share = _shard_count(info.num_eval_examples, ctx.input_pipeline_id,
                         ctx.num_input_pipelines)
    return synthetic.eval_dataset(replica_batch_size, cfg.eval_size,
                                  info.num_classes, dtype, share,
                                  seed=seed + 1000)

  return train_input_fn, eval_input_fn


def pixel_batches(cfg: RunConfig, info: DatasetInfo, batch_size: int,
                  from_training: bool = False,
                  limit: int = 0) -> tf.data.Dataset:
  """Batches of (uint8 pixels, labels) preprocessed as evaluation does: what
  exports take. The validation data, or with `from_training` the first
  `limit` training examples (int8 calibration); every example once."""
  cfg = dataclasses.replace(cfg, data_loader_image_type='uint8')
  if from_training:
    cfg = dataclasses.replace(cfg, num_eval_examples=limit)
    info = dataclasses.replace(
        info, eval_files=info.train_files,
        num_eval_examples=_limited(info.num_train_examples, limit))
  _, eval_input_fn = make_input_fns(cfg, info, batch_size)
  return eval_input_fn(tf.distribute.InputContext())


def _file_input_fns(cfg: RunConfig, info: DatasetInfo, batch: int,
                    dtype: tf.DType, build, start_step: int):
  """Input fns over `info`'s files, `batch` examples per replica; `build` is
  a format's dataset function."""

  def input_fn(ctx: tf.distribute.InputContext, is_training: bool):
    # Each step, every replica this pipeline feeds takes one batch (a
    # Horovod-widened context counts pipelines over all workers).
    replicas_fed = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
    return build(
        list(info.train_files if is_training else info.eval_files),
        start_record=start_step * batch * replicas_fed if is_training else 0,
        is_training=is_training, batch_size=batch,
        image_size=cfg.image_size if is_training else cfg.eval_size,
        dtype=dtype,
        input_pipeline_id=ctx.input_pipeline_id,
        num_input_pipelines=ctx.num_input_pipelines, seed=cfg.global_seed,
        limit=cfg.num_train_examples if is_training else cfg.num_eval_examples)

  return (lambda ctx: input_fn(ctx, True), lambda ctx: input_fn(ctx, False))


def _shard_count(num_examples: int, index: int, num_shards: int) -> int:
  """Examples of shard `index` when `num_examples` are dealt round-robin."""
  return num_examples // num_shards + (1 if index < num_examples % num_shards
                                       else 0)
