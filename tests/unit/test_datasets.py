"""What data a config selects, how big it is, and the input fns the trainer
reads: batches of the plan's per-replica size, every evaluation example
once over the pipelines."""

import pytest
import tensorflow as tf

from common.errors import UsageError
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data.preprocessing import normalize_images
from tests.support.records import write_dataset


def _context(pipeline_id=0, pipelines=1, replicas=1):
  return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                    input_pipeline_id=pipeline_id,
                                    num_replicas_in_sync=replicas)


def test_synthetic_data_has_imagenet_sizes_unless_limited():
  info = datasets.describe(RunConfig(use_synthetic_data=True))
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples
          ) == (datasets.IMAGENET_NUM_CLASSES,
                datasets.IMAGENET_NUM_TRAIN_EXAMPLES,
                datasets.IMAGENET_NUM_EVAL_EXAMPLES)
  info = datasets.describe(RunConfig(use_synthetic_data=True, num_classes=7,
                                     num_eval_examples=9))
  assert (info.num_classes, info.num_eval_examples) == (7, 9)


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('records')
  write_dataset(str(data_dir), num_classes=3, train_per_shard=(4, 4),
                eval_per_shard=(3, 2))
  return str(data_dir)


def test_only_uint8_images_leave_their_normalisation_to_the_device():
  """What network.build_models wraps the network for: uint8 images and
  the normalisation on the device; fp32 and bf16 come normalised."""
  assert datasets.pipeline_output(RunConfig(
      data_loader_image_type='uint8')) == (tf.uint8, normalize_images)
  assert datasets.pipeline_output(RunConfig(
      data_loader_image_type='fp32')) == (tf.float32, None)
  assert datasets.pipeline_output(RunConfig(
      data_loader_image_type='bf16')) == (tf.bfloat16, None)


def test_records_are_counted_and_can_be_limited(records):
  info = datasets.describe(RunConfig(data_dir=records, num_train_examples=6))
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples
          ) == (3, 6, 5)
  assert len(info.train_files) == 2 and len(info.eval_files) == 2


def test_fewer_classes_than_the_data_has_is_a_usage_error(records):
  with pytest.raises(UsageError, match='--num_classes=2 but the data'):
    datasets.describe(RunConfig(data_dir=records, num_classes=2))


@pytest.mark.parametrize('use_synthetic_data', [True, False])
def test_input_fns_batch_per_replica_and_evaluate_every_example_once(
    records, use_synthetic_data):
  cfg = RunConfig(data_dir=records, use_synthetic_data=use_synthetic_data,
                  num_classes=3, num_eval_examples=5, image_size=32)
  info = datasets.describe(cfg)
  train_fn, eval_fn = datasets.make_input_fns(cfg, info, replica_batch_size=2)
  images, labels = next(iter(train_fn(_context(replicas=2))))
  assert images.shape == (2, 32, 32, 3) and labels.shape == (2,)
  evaluated = sum(int(l.shape[0]) for i in range(2)
                  for _, l in eval_fn(_context(i, pipelines=2, replicas=2)))
  assert evaluated == 5


def test_only_tfrecords_count_skipped_records(records):
  assert datasets.skipped_records_counter(
      RunConfig(data_dir=records, skip_corrupt_records=True)) is not None
  assert datasets.skipped_records_counter(RunConfig(
      use_synthetic_data=True, skip_corrupt_records=True)) is None
  assert datasets.skipped_records_counter(RunConfig(data_dir=records)) is None


def test_cifar_evaluates_whole_images():
  assert datasets.eval_crop_fraction(RunConfig(dataset='cifar10')) == 1.0
  assert datasets.eval_crop_fraction(RunConfig()) == 224 / 256
