"""The data's option groups: what data is read and how (DataConfig), how
training augments it (AugmentationConfig), and a tf.data service that may
serve it (DataServiceConfig); each with its choices and its own checks."""

import dataclasses
from typing import Optional, Tuple

from common.errors import UsageError
from resnet_keras.config.options import check_fields, option
from resnet_keras.config.randaugment_spec import parse_randaugment

DATASETS = ('imagenet', 'cifar10', 'cifar100')
LOADER_IMAGE_TYPES = ('fp32', 'bf16', 'uint8')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What data, how much of it, and how it is read."""
  data_dir: str = option(
      '/data/tensorflow_datasets/imagenet/tf_records',
      'Directory with the TFRecord shards.', alias='dd', path=True)
  dataset: str = option(
      'imagenet',
      'imagenet (any ImageNet-format TFRecords), cifar10 or cifar100 '
      '(the standard binary files in --data_dir).',
      choices=DATASETS)
  use_synthetic_data: bool = option(
      False,
      'Train on random images held in memory (no files).', alias='synth')
  image_size: int = option(
      224,
      'Height and width of the model input (>= 32 with the imagenet '
      'stem, 16 small, 8 cifar); with progressive resizing, the size it '
      'ends at.')
  eval_image_size: int = option(
      0,
      "Height and width of evaluation's (and the export's) input; 0: "
      '--image_size. Larger than the training size makes up for the '
      "random crops' zoom (FixRes; FFCV trains at 192 and tests at "
      '256).')
  progressive_resize_start_size: int = option(
      0,
      'Progressive resizing: training starts at this height and width '
      'and rises to --image_size over --progressive_resize_epochs, in '
      'steps of --progressive_resize_multiple; 0: off.')
  progressive_resize_epochs: Optional[Tuple[int, int]] = option(
      None,
      '"START,END": the size rises from the start size at epoch START '
      '(counted from 0) to --image_size at epoch END; default: over the '
      'whole run.')
  progressive_resize_multiple: int = option(
      0,
      'Progressive sizes are multiples of this; 0: 32 for images of 128 '
      'px or more, else 4.',
      within='>= 0', note='(0: auto)')
  data_loader_image_type: str = option(
      'fp32',
      'dtype images leave the input pipeline in: fp32, bf16, or uint8 '
      '(cast and mean subtraction run on the device).', alias='dlit',
      choices=LOADER_IMAGE_TYPES)
  experimental_preloading: bool = option(
      True,
      'Prefetch batches to the accelerator (prefetch_to_device); a '
      'no-op on CPU.')
  num_classes: int = option(
      0,
      'Output units; 0: from the dataset (synthetic: 1000).',
      within='>= 0')
  num_train_examples: int = option(
      0,
      'Use only the first N training examples; 0: all (synthetic: '
      "ImageNet's 1,281,167).",
      within='>= 0')
  num_eval_examples: int = option(
      0,
      'Use only the first N validation examples; 0: all (synthetic: '
      "ImageNet's 50,000).",
      within='>= 0')
  train_crop_min_area: float = option(
      0.05,
      'Smallest fraction of an image a random training crop covers '
      '(0.05: ImageNet; larger for small images).',
      within='(0, 1]', says='is a fraction')
  eval_crop_fraction: float = option(
      224 / 256,
      'Evaluation keeps this central fraction of the short side (0.875 '
      "= 224/256, ImageNet's standard; 1.0 for small images centred in "
      'their frame).',
      within='(0, 1]', says='is a fraction')
  training_dataset_cache: bool = option(
      False,
      'Cache the training records in memory after the first epoch (for '
      'datasets that fit in RAM). With --train_crop_min_area=1 (no '
      'crop) the decoded, resized images are cached instead, and only '
      'the flip runs per epoch.')
  datasets_num_private_threads: int = option(
      0,
      'Threads of a private tf.data pool for the input pipeline; 0: '
      "tf.data's shared pool.",
      within='>= 0')
  skip_corrupt_records: bool = option(
      False,
      'Skip unreadable TFRecord records and undecodable images (counted '
      'and reported at the end) instead of stopping with an error that '
      'names the file.')

  @property
  def eval_size(self) -> int:
    """Height and width of evaluation's and the export's input."""
    return self.eval_image_size or self.image_size

  @property
  def input_size(self) -> Optional[int]:
    """The one size every input of the network has, or None when training
    resizes progressively or evaluation has a size of its own."""
    if self.progressive_resize_start_size or self.eval_size != self.image_size:
      return None
    return self.image_size

  @property
  def resize_multiple(self) -> int:
    return self.progressive_resize_multiple or (
        32 if self.image_size >= 128 else 4)

  def _check_data(self) -> None:
    check_fields(self, DataConfig)
    if self.num_classes == 1:
      raise UsageError('--num_classes=1 cannot be trained as a classifier; '
                       'use 0 (from the data) or >= 2')
    epochs = self.progressive_resize_epochs
    if epochs is not None and not (
        len(epochs) == 2 and 0 <= epochs[0] <= epochs[1]):
      raise UsageError('--progressive_resize_epochs must be "START,END" with '
                       '0 <= START <= END (epochs counted from 0), got '
                       f'{",".join(map(str, epochs))}')
    start = self.progressive_resize_start_size
    if start > self.image_size:
      raise UsageError(
          f'--progressive_resize_start_size={start} is larger than '
          f'--image_size={self.image_size}, where progressive resizing '
          'ends; start smaller')
    if epochs is not None and not start:
      raise UsageError('--progressive_resize_epochs needs '
                       '--progressive_resize_start_size (the size training '
                       'starts at)')


ERASING_MODES = ('pixel', 'const')


@dataclasses.dataclass(frozen=True)
class AugmentationConfig:
  """timm's training augmentations (data/augment.py): per image after the
  crop and flip, then per batch. All off by default."""
  randaugment: str = option(
      '',
      "RandAugment in timm's grammar: rand-m<magnitude 0-10>-n<ops>"
      '-mstd<magnitude noise>-inc<1: the increasing-severity op set>'
      '-p<probability of each op>, e.g. rand-m7-mstd0.5-inc1 (ResNet '
      'strikes back; n defaults to 2, p to 0.5), or trivial '
      '(TrivialAugment: one op, magnitude uniform in 0-10). Translations '
      "are fractions of the image's side; grey images stay grey. Empty: "
      'off.')
  random_erasing: float = option(
      0.0,
      "Probability of timm's random erasing per image: a box of 2%-1/3 of "
      'the area, aspect log-uniform in 0.3-3.3, after RandAugment.',
      within='[0, 1]', says='is a probability,')
  random_erasing_mode: str = option(
      'pixel',
      "What erasing fills the box with: pixel (per-pixel noise, N(0, 1) "
      "after timm's normalisation) or const (the mean: 0 after "
      'normalisation).',
      choices=ERASING_MODES)
  mixup_alpha: float = option(
      0.0,
      'Mixup: each batch blended with itself reversed, by a weight from '
      'Beta(alpha, alpha) (0.1-0.2 in ResNet strikes back); the targets '
      'blend alike, label smoothing applied once inside them. 0: off.',
      within='>= 0')
  cutmix_alpha: float = option(
      0.0,
      'CutMix: a box of the batch reversed pasted into each batch, its '
      'area from Beta(alpha, alpha) (1.0 in ResNet strikes back), the '
      'targets weighted by the box clipped at the border. 0: off.',
      within='>= 0')
  mix_prob: float = option(
      1.0,
      'Probability that a batch is mixed at all (mixup or CutMix); the '
      'others train on their smoothed one-hot targets.',
      within='[0, 1]', says='is a probability,')
  mix_switch_prob: float = option(
      0.5,
      'With both --mixup_alpha and --cutmix_alpha: probability that a '
      'mixed batch uses CutMix rather than mixup.',
      within='[0, 1]', says='is a probability,')
  repeated_augmentation: int = option(
      1,
      'Each training image comes this many times in a row, augmented '
      'differently each time (3 in ResNet strikes back A1/A2); the epoch '
      'keeps its length, so it holds 1/N of the images N times each. 1: '
      'off.',
      within='>= 1')

  @property
  def mixes_batches(self) -> bool:
    return self.mixup_alpha > 0 or self.cutmix_alpha > 0

  @property
  def augments_images(self) -> bool:
    return bool(self.randaugment) or self.random_erasing > 0

  def _check_augmentation(self) -> None:
    check_fields(self, AugmentationConfig)
    try:
      parse_randaugment(self.randaugment)
    except ValueError as e:
      raise UsageError(f'--randaugment: {e}') from None


DATA_SERVICE_SHARDING = ('off', 'dynamic')


@dataclasses.dataclass(frozen=True)
class DataServiceConfig:
  """Training input from a tf.data service (data/input_service.py)."""
  tf_data_service: str = option(
      '',
      'grpc://HOST:PORT of a tf.data service dispatcher: the training '
      'input pipeline runs on its workers (python -m '
      'resnet_keras.data.service); evaluation stays here. Empty: local.')
  tf_data_service_job_name: str = option(
      '',
      "The tf.data service job the run's workers share (each gets other "
      'batches); empty: one named after --model_dir. Each resume and '
      'image size gets a job of its own under it.')
  tf_data_service_sharding: str = option(
      'off',
      'off: every data worker serves the whole shuffled stream (batches '
      'at least once; survives a lost data worker); dynamic: files '
      'split among data workers (each record once an epoch).',
      choices=DATA_SERVICE_SHARDING)
  tf_data_service_timeout: int = option(
      300,
      'Seconds training may wait for one batch from the tf.data service '
      'before the run ends naming it; 0: wait for it.',
      within='>= 0')
  tf_data_service_workers: int = option(
      0,
      'How many data workers serve the run (set by demo_resnet_keras.py '
      '--data_service_hosts; recorded, 0: not known).',
      within='>= 0')

  def _check_data_service(self) -> None:
    check_fields(self, DataServiceConfig)
