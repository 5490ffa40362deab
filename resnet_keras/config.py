"""RunConfig: the one object everything downstream of the flags reads, and
the one place each option is declared.

Each field is declared once, with `options.option(default, help, ...)`: its
choices or range, its short flag and its help live beside its default, and
flags.py, the checks (`RunConfig.check`) and --print_config are derived
from it. The fields come in groups by concern, one frozen dataclass each
(DataConfig ... RuntimeConfig), and each group checks its own fields;
RunConfig inherits them all into one flat record (code reads
`cfg.image_size`; config.json stays one flat object) and holds only the
rules that relate several groups.

Entry points parse flags once (`resnet_keras.flags.config_from_flags`); the
library only sees a frozen RunConfig, so tests build configs directly and no
module reads absl's FLAGS. The batch and step arithmetic is in plan.py; what
'auto' values become on a machine is decided in hardware.py.
"""

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

from common import files
from common.errors import UsageError
from resnet_keras.randaugment_spec import parse_randaugment
from resnet_keras.options import check_fields, option

DATASETS = ('imagenet', 'cifar10', 'cifar100')
DTYPES = ('fp32', 'bf16', 'fp16', 'auto')
LOADER_IMAGE_TYPES = ('fp32', 'bf16', 'uint8')
OPTIMIZERS = ('SGD', 'LARS', 'RMSProp', 'AdamW', 'LAMB')
# Adam's moments and decoupled weight decay, inside the optimizer.
ADAM_OPTIMIZERS = ('AdamW', 'LAMB')
# The per-example loss of a training step (objective.py).
LOSSES = ('softmax', 'bce')
LR_SCHEDULES = ('piecewise', 'polynomial', 'constant', 'cosine', 'stepped',
                'exponential', 'linear')
RESNET_DEPTHS = (10, 18, 34, 50, 101, 152)
NORMS = ('batch', 'group')
# Output channels of the ResNet's stages; the stem has the first, bottleneck
# blocks 4x. --width_multiplier scales them to multiples of CHANNEL_MULTIPLE.
STAGE_FILTERS = (64, 128, 256, 512)
CHANNEL_MULTIPLE = 8
CONV_IMPLS = ('auto', 'native', 'matmul')
RELU_IMPLS = ('auto', 'native', 'bitwise', 'xla')
# Stem -> how much it downsamples. The stages downsample 8x more, so an image
# must be at least 8 x this many pixels for the last stage to see 1x1.
STEM_STRIDES = {'imagenet': 4, 'small': 2, 'cifar': 1}
STAGE_STRIDE = 8
# How the stem's convolution starts (stem_init.pca_stem_kernel).
STEM_INITS = ('random', 'pca')
KERAS_APPLICATIONS_MODELS = ('ResNet50', 'ResNet101', 'ResNet152',
                             'ResNet50V2', 'ResNet101V2', 'ResNet152V2')
DATA_SERVICE_SHARDING = ('off', 'dynamic')
ERASING_MODES = ('pixel', 'const')
DISTRIBUTION_STRATEGIES = ('off', 'one_device', 'mirrored',
                           'multi_worker_mirrored')

# ImageNet-1k, used for synthetic data so its step counts match real runs.
IMAGENET_NUM_CLASSES = 1000
IMAGENET_NUM_TRAIN_EXAMPLES = 1281167
IMAGENET_NUM_EVAL_EXAMPLES = 50000


def _format_pair(steps: Optional[Tuple[int, int]]) -> Optional[str]:
  return steps and ','.join(map(str, steps))


def _parse_pair(text: Optional[str]) -> Optional[Tuple[int, int]]:
  """--profile_steps's "start,stop" (its range is checked with the rest)."""
  if not text:
    return None
  try:
    start, stop = (int(p) for p in text.split(','))
  except ValueError:
    raise UsageError(f'--profile_steps must be "start,stop" (two integers), '
                     f'got "{text}"') from None
  return start, stop


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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The network."""
  resnet_depth: int = option(
      50,
      'ResNet v1.5 depth: 10, 18, 34, 50, 101 or 152 (10: one basic '
      'block per stage).',
      choices=RESNET_DEPTHS)
  stem: str = option(
      'imagenet',
      'First layers before the residual stages: imagenet (7x7/2 conv + '
      '3x3/2 max pool), small (3x3/1 conv + max pool: for 28-64 px '
      'images, 4x the compute at the same size) or cifar (3x3/1 conv, '
      'no pool: 16x).',
      choices=tuple(STEM_STRIDES))
  keras_applications_model: Optional[str] = option(
      None,
      'Use a keras.applications backbone instead: ResNet50, ResNet101, '
      'ResNet152, ResNet50V2, ResNet101V2, ResNet152V2.',
      choices=KERAS_APPLICATIONS_MODELS)
  width_multiplier: float = option(
      1.0,
      'Channels of every layer x this, rounded to multiples of 8 '
      "(Wide-ResNet's k; below 1 for a cheaper model): 0.25 trains "
      'ResNet-18 on 28x28 images several times faster on CPUs '
      '(the recipe fashion_mnist_resnet18_w025). 1: the standard '
      'ResNet.',
      within='> 0')
  stage_widths: Tuple[int, ...] = option(
      (),
      'Output channels of the stem and the four stages (a bottleneck '
      "block's inner ones; 4x leave it), e.g. 24,48,96,192, instead of "
      "the standard ones x --width_multiplier (given, it replaces that): a "
      "shape the CPU's kernels like. Empty: the standard widths.")
  norm: str = option(
      'batch',
      'Normalisation after each convolution: batch, or group '
      '(GroupNormalization: independent of the batch, for small '
      'per-replica batches; no moving statistics).',
      choices=NORMS)
  groups: int = option(
      32,
      '--norm=group: channel groups per layer; must divide 64 (every '
      'channel count of the ResNets).')
  sync_batch_norm: bool = option(
      False,
      'Batch statistics over the global batch (all-reduced across '
      'tf.distribute replicas, or Horovod workers) instead of each '
      "replica's own batch.")
  enable_recompute: bool = option(
      False,
      "Keep only each residual stage's input during the forward pass "
      'and recompute its activations in the backward pass '
      '(tf.recompute_grad): less memory for about one more forward pass '
      'of compute.')
  blurpool: bool = option(
      False,
      "Anti-aliased downsampling (BlurPool, as in FFCV's ResNets): "
      'inputs of strided convolutions blurred by a fixed 3x3 binomial '
      "filter, the stem's max pooling at stride 1 then blurred and "
      "subsampled. No new weights; part of the model's identity for "
      'resume and warm start.')
  drop_path_rate: float = option(
      0.0,
      'Stochastic depth: training drops each residual branch per example, '
      'at a rate rising from 0 (first block) to this (last), survivors x '
      '1/keep (0.05: ResNet strikes back A1/A2). No new weights. 0: off.',
      within='[0, 1)', says='is a rate,')

  @property
  def model_name(self) -> str:
    if self.keras_applications_model:
      return self.keras_applications_model
    if self.stage_widths:
      width = '_c' + '-'.join(map(str, self.stage_widths))
    elif self.width_multiplier == 1:
      width = ''
    else:
      width = f'_w{self.width_multiplier:g}'
    return f'resnet{self.resnet_depth}{width}'

  @property
  def stage_filters(self) -> Tuple[int, ...]:
    if self.stage_widths:
      return tuple(self.stage_widths)
    return scaled_filters(STAGE_FILTERS, self.width_multiplier)

  @property
  def norm_name(self) -> str:
    """'batch' or 'group<groups>': what the normalisation weights of a
    checkpoint mean (sync batch norm has batch norm's)."""
    return f'group{self.groups}' if self.norm == 'group' else self.norm

  @property
  def min_image_size(self) -> int:
    """Smallest input for which the last stage still sees 1x1."""
    if self.keras_applications_model:
      return STAGE_STRIDE * STEM_STRIDES['imagenet']
    return STAGE_STRIDE * STEM_STRIDES[self.stem]

  def _check_model(self) -> None:
    check_fields(self, ModelConfig)
    if self.stage_widths:
      widths = tuple(self.stage_widths)
      if len(widths) != len(STAGE_FILTERS) or min(widths) < 1:
        raise UsageError('--stage_widths takes the channels of the '
                         f'{len(STAGE_FILTERS)} stages, each >= 1 (e.g. '
                         f'24,48,96,192), got {",".join(map(str, widths))}')
    if self.norm == 'group':
      # Groups must divide every channel count; each one (bottlenecks' 4x
      # included) is a multiple of the stages' gcd.
      common = math.gcd(*self.stage_filters)
      if self.groups <= 0 or common % self.groups:
        divisors = [d for d in range(1, common + 1) if common % d == 0]
        raise UsageError(
            f'--groups={self.groups} must divide every channel count of the '
            f'ResNet (multiples of {common}); use one of: '
            f'{", ".join(map(str, divisors))}')
      if self.sync_batch_norm:
        raise UsageError('--sync_batch_norm needs --norm=batch: group norm '
                         'has no batch statistics to synchronise')


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """How the weights start when model_dir has no checkpoint (start.py):
  from another run's checkpoint, or from initialisers some of which read
  the data or zero a scale."""
  zero_init_residual: bool = option(
      False,
      'Start the scale (gamma) of the last normalisation in each '
      'residual branch at 0, so every block begins as its shortcut and '
      'the network as a shallow one (Goyal et al., "ImageNet in 1 '
      'hour"). Only the initial values change: checkpoints and exports '
      'are the same either way.')
  stem_init: str = option(
      'random',
      "How the stem's convolution starts: random (He normal) or pca: "
      'its filters, in +/- pairs, are the principal directions of '
      "patches of the first training images (as many as the patches' "
      'rank and half the filters allow; the rest stay random), so its '
      'channels start decorrelated instead of all seeing the local '
      "brightness (airbench's whitening, as an initialisation: the "
      'filters keep training). Only the initial values change.',
      choices=STEM_INITS)
  restore_from: Optional[str] = option(
      None,
      "Start a new run from another run's checkpoint (a checkpoint "
      'prefix such as DIR/ckpt-8, or a model_dir: its latest) of the '
      'same model; only while --model_dir has no checkpoint of its own '
      '(then it resumes). TensorFlow reads a checkpoint as trusted input: '
      'take only checkpoints you trust.', path=True)
  restore_optimizer: bool = option(
      False,
      'With --restore_from: also restore the optimizer (momentum slots, '
      'step, loss scale), so training goes on from that step; default: '
      'weights only, step 0.')
  pretrained_checkpoint: Optional[str] = option(
      None,
      'Transfer learning: load every layer but the classification head '
      "from another run's checkpoint (prefix or model_dir) of the same "
      "architecture; the head is new, for this data's classes. TensorFlow "
      'reads a checkpoint as trusted input: take only checkpoints you '
      'trust.', path=True)
  freeze_backbone: bool = option(
      False,
      'With --pretrained_checkpoint: train only the head; the '
      "backbone's batch norm keeps its pretrained statistics (inference "
      'mode).')

  def _check_warm_start(self) -> None:
    check_fields(self, WarmStartConfig)
    if self.restore_from and self.pretrained_checkpoint:
      raise UsageError('--restore_from (the whole model) and '
                       '--pretrained_checkpoint (its backbone) both choose the '
                       'starting weights; use one')
    if self.restore_optimizer and not self.restore_from:
      raise UsageError('--restore_optimizer restores the optimizer of '
                       '--restore_from; give --restore_from too')
    if self.freeze_backbone and not self.pretrained_checkpoint:
      raise UsageError('--freeze_backbone trains only the head on top of '
                       '--pretrained_checkpoint; give --pretrained_checkpoint '
                       'too')


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
  """Numeric precision, compilation, and the kernels that run the
  network (their auto choices follow the dtype and the machine)."""
  dtype: str = option(
      'fp32',
      'Compute precision: fp32, bf16 (mixed_bfloat16; fast on CPUs with '
      'AMX-BF16/AVX512_BF16 and on GPUs of compute capability >= 8.0, '
      'emulated and slower than fp32 on other CPUs), fp16 '
      '(mixed_float16 with loss scaling; GPU only in practice), or auto '
      '(bf16 where it is fast, fp16 on older GPUs, fp32 elsewhere; the '
      'choice and why are logged and recorded in config.json).', alias='dt',
      choices=DTYPES)
  loss_scale: float = option(
      0.0,
      'fp16: a fixed loss scale; 0: dynamic loss scaling.',
      within='>= 0')
  enable_xla: bool = option(
      False,
      'Compile with XLA (auto-clustering). For GPUs; on CPUs it is '
      'slower than the default oneDNN kernels.')
  conv_impl: str = option(
      'auto',
      'How convolutions run: native (oneDNN/cuDNN), matmul (1x1 '
      'convolutions as one matmul, and kernel gradients of 3x3 '
      'convolutions on maps <= 7x7 with >= 256 channels as patches x '
      'matmul: much faster in bf16 on CPUs with AMX), or auto (matmul '
      'for bf16 on CPUs, and for fp32 on CPUs without AVX-512). Same '
      'weights and results either way.',
      choices=CONV_IMPLS)
  relu_impl: str = option(
      'auto',
      'How the ReLU after each residual add runs in training: native '
      '(tf.nn.relu), xla (the add and the ReLU as one XLA-compiled '
      'kernel, same results: ~7% faster ResNet-50 training in bf16 on '
      "CPUs), bitwise (an integer max on the floats' bits, no XLA; same "
      'results except that a negative NaN becomes 0), or auto (xla for '
      'bf16 on CPUs). Evaluation and export always run tf.nn.relu.',
      choices=RELU_IMPLS)

  def _check_precision(self) -> None:
    check_fields(self, PrecisionConfig)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How long training runs; when and how it logs, evaluates and stops."""
  batch_size: int = option(
      256,
      'Global batch size (tf.distribute); per worker with Horovod.', alias='bs',
      within='> 0')
  train_epochs: int = option(
      1,
      'Number of training epochs.', alias='te',
      within='> 0')
  train_steps: int = option(
      0,
      'Cap on steps per epoch; 0: the whole training set.',
      within='>= 0')
  steps_per_loop: int = option(
      50,
      'Steps run on the device per host call (one tf.function); capped '
      'at steps per epoch.',
      within='> 0')
  num_accumulation_steps: int = option(
      1,
      "Split each step's batch into this many micro-batches and sum "
      'their gradients (float32) before one optimizer update: '
      '--batch_size stays the batch per update (for the LR, schedule '
      'and logs) while memory holds one micro-batch.',
      within='> 0')
  planned_global_batch: int = option(
      0,
      'The global batch the run was planned for, when this job\'s differs '
      '(set by demo_resnet_keras.py --elastic_batch scale after it lost '
      'hosts): steps per epoch and the schedule stay the planned ones, '
      'each step takes this job\'s batch, and the learning rate is scaled '
      'by this job\'s global batch over the planned one (the linear '
      'scaling rule). 0: this job\'s global batch.',
      within='>= 0')
  log_steps: int = option(
      100,
      'Print a status line every N steps.',
      within='> 0')
  epochs_between_evals: int = option(
      1,
      'Evaluate every N epochs (and at the end).', alias='ebe',
      within='> 0')
  eval_offset_epochs: int = option(
      0,
      'Epoch of the first evaluation, then every --epochs_between_evals '
      '(MLPerf style: e.g. 3 with 4 evaluates after epochs 3, 7, 11, '
      '...); 0: first at --epochs_between_evals. The end is always '
      'evaluated.',
      within='>= 0')
  skip_eval: bool = option(
      False,
      'Do not evaluate.')
  eval_flip: bool = option(
      False,
      'Evaluate each image and its mirror image and average their '
      'logits (test-time flip augmentation; each image counts once). '
      'Evaluations, and python -m resnet_keras.validate on the run, '
      'report the averaged predictions.')
  target_accuracy: float = option(
      0.0,
      'Stop once eval top-1 accuracy reaches this fraction; 0: never '
      'stop early.',
      within='[0, 1]', says='is a fraction')
  global_seed: Optional[int] = option(
      None,
      'Seed for weights, data order and augmentation (deterministic '
      "input order; TensorFlow's op determinism stays off): on CPUs two "
      'runs with the same flags log the same losses step by step, and a '
      'resumed run continues exactly.')
  use_tf_function: bool = option(
      True,
      'Compile steps with tf.function (off: eager, for debugging).')
  use_tf_while_loop: bool = option(
      True,
      'Run the steps of a loop inside one tf.function (tf.range); off: '
      'one host call per step.')

  def _check_loop(self) -> None:
    check_fields(self, LoopConfig)
    if self.use_tf_while_loop and not self.use_tf_function:
      raise UsageError('--use_tf_while_loop needs --use_tf_function; pass '
                       '--nouse_tf_while_loop to run steps from Python')


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
  """The learning rate: its peak, warmup and decay (lr_schedules.py)."""
  base_learning_rate: float = option(
      0.1,
      'SGD, RMSProp, AdamW and LAMB: learning rate per 256 images '
      '(scaled by global batch / 256: "ResNet strikes back" LAMB, 5e-3 '
      'at batch 2048, is 6.25e-4 here); LARS: the peak learning rate as '
      'is.',
      within='> 0')
  warmup_epochs: float = option(
      5.0,
      'Epochs of linear warmup from 0 to the peak.',
      within='>= 0')
  lr_schedule: str = option(
      'piecewise',
      'piecewise (x0.1 at epochs 30/60/80), polynomial (power 2), '
      'constant, cosine, stepped (x lr_decay_factor at '
      'lr_decay_points), exponential (x lr_decay_factor every '
      'lr_decay_epochs) or linear (straight down to 0 at the last step, '
      "FFCV's); all with warmup.",
      choices=LR_SCHEDULES)
  lr_per_epoch: bool = option(
      False,
      "Hold the learning rate through each epoch at the schedule's "
      'value in the middle of the epoch; default: a new value each '
      'step.')
  end_learning_rate: float = option(
      1e-4,
      'Where the polynomial and cosine decays end.',
      within='>= 0')
  lars_decay_epochs: float = option(
      0.0,
      'Polynomial decay reaches end_learning_rate at this epoch (0: at '
      'the end of the run).',
      within='>= 0')
  lr_decay_factor: float = option(
      0.1,
      'stepped and exponential: the factor of each decay step.',
      within='(0, 1]')
  lr_decay_points: Tuple[float, ...] = option(
      (0.3, 0.6, 0.8),
      "stepped: fractions of the run's steps where the learning rate is "
      'multiplied by lr_decay_factor, e.g. 0.3,0.6,0.8.')
  lr_decay_epochs: float = option(
      30.0,
      'exponential: epochs (after warmup) per multiplication by '
      'lr_decay_factor.',
      within='> 0')

  def _check_schedule(self) -> None:
    check_fields(self, ScheduleConfig)
    points = tuple(self.lr_decay_points)
    if not (points and all(0 < p < 1 for p in points) and
            list(points) == sorted(set(points))):
      raise UsageError(
          '--lr_decay_points must be increasing fractions of the run in '
          f'(0, 1), e.g. 0.3,0.6,0.8; got {",".join(map(str, points))}')


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """What a training step minimises besides the optimizer (objective.py):
  the loss, its label smoothing, and weight decay."""
  loss: str = option(
      'softmax',
      'softmax: cross-entropy of the softmax. bce: a sigmoid cross-'
      'entropy per class on the logits (timm\'s BinaryCrossEntropy, as '
      'in "ResNet strikes back"), summed over the classes and averaged '
      "over the batch (timm's sum_classes): each logit's gradient is "
      "sigmoid(z) - target, as the softmax's is p - target, so SGD's "
      'learning rates keep their scale (a mean over the classes, '
      "timm's default, divides the gradient by the class count; AdamW "
      "and LAMB are invariant to the loss's scale). Its loss starts "
      'near classes x log 2. Evaluation, exports and predictions still '
      'give the softmax probabilities.',
      choices=LOSSES)
  bce_target_threshold: float = option(
      0.0,
      '--loss=bce: targets above this become 1 and the others 0, after '
      'label smoothing and mixing (timm\'s target_threshold: 0.2 in the '
      'public "ResNet strikes back" reproductions). 0: soft targets as '
      'they are.',
      within='[0, 1)', note='(0: none)')
  label_smoothing: float = option(
      0.0,
      'Label smoothing of the loss: targets 1 - s + s/classes and '
      's/classes.',
      within='[0, 1)')
  weight_decay: float = option(
      1e-4,
      'SGD, RMSProp and LARS: adds weight_decay * w to the gradient of '
      'every conv/dense kernel, on every path (regularisers, single L2 '
      'op, LARS). AdamW and LAMB: decoupled, inside the optimizer: w -= '
      "lr * weight_decay * w each step (PyTorch's and timm's AdamW; LAMB "
      'scales it by the trust ratio with the rest of the update), so '
      'typical values are 0.01-0.05, not 1e-4.',
      within='>= 0')
  single_l2_loss_op: bool = option(
      False,
      'SGD/RMSProp: one L2 term over all kernels instead of per-layer '
      'regularisers (same gradient, fewer ops).')

  def _check_loss(self) -> None:
    check_fields(self, LossConfig)
    if self.bce_target_threshold and self.loss != 'bce':
      raise UsageError('--bce_target_threshold binarises the targets of '
                       '--loss=bce; add --loss=bce or drop the threshold')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer and the average of the weights."""
  optimizer: str = option(
      'SGD',
      'SGD (momentum), LARS, RMSProp, AdamW (decoupled weight decay, as '
      "PyTorch's and timm's) or LAMB (AdamW's update scaled per kernel "
      'by ||w|| / ||update||, as timm\'s, which "ResNet strikes back" '
      'trains with). LARS and LAMB adapt conv/dense kernels only; '
      'biases and normalisation weights get neither weight decay nor '
      'the trust ratio.',
      choices=OPTIMIZERS)
  lars_epsilon: float = option(
      0.0,
      'Epsilon in the LARS trust-ratio denominator.',
      within='>= 0')
  momentum: float = option(
      0.9,
      'Momentum of SGD, LARS and RMSProp (AdamW and LAMB: --adam_beta1).',
      within='[0, 1)')
  nesterov: bool = option(
      False,
      'Nesterov momentum (SGD and LARS).')
  adam_beta1: float = option(
      0.9,
      'AdamW and LAMB: decay of the moving average of gradients.',
      within='[0, 1)')
  adam_beta2: float = option(
      0.999,
      'AdamW and LAMB: decay of the moving average of squared '
      'gradients.',
      within='[0, 1)')
  adam_epsilon: float = option(
      1e-6,
      'AdamW and LAMB: added to sqrt(v_hat) in the denominator (bias-'
      "corrected, as PyTorch's). 1e-6 is timm's LAMB default, which the "
      '"ResNet strikes back" recipes trained with; PyTorch\'s and timm\'s '
      'AdamW default is 1e-8 (pass it to match them).',
      within='> 0')
  clip_grad_norm: float = option(
      0.0,
      'Clip the global norm of the gradients (all variables together) '
      'to this value: after the all-reduce, gradient accumulation and '
      'the removal of the loss scale, before the optimizer. timm\'s LAMB '
      'clips at 1.0 itself ("ResNet strikes back"): pass 1 to match it. '
      '0: off.',
      within='>= 0', note='(0: off)')
  rmsprop_rho: float = option(
      0.9,
      'RMSProp: decay of the moving average of squared gradients.',
      within='[0, 1)')
  rmsprop_epsilon: float = option(
      1e-3,
      'RMSProp: stabilises the denominator sqrt(ms + eps) (tf_keras '
      "puts it outside the root when --momentum=0); tf_keras's default "
      '1e-7 makes the first steps huge.',
      within='> 0')
  ema_decay: float = option(
      0.0,
      'Keep an exponential moving average of the weights with this '
      'decay (e.g. 0.999; 0: none): it is what evaluations score, '
      'validate reports and exports hold; the checkpoint keeps both.',
      within='[0, 1)', says='is the decay of the weight average,', note='(0: none)')
  ema_warmup: bool = option(
      False,
      "Ramp the average's decay as min(ema_decay, (1 + step) / (10 + "
      'step)), so it forgets the random start quickly.')

  @property
  def uses_lars(self) -> bool:
    return self.optimizer == 'LARS'

  @property
  def uses_adam(self) -> bool:
    """AdamW or LAMB: Adam's moments, weight decay inside the optimizer."""
    return self.optimizer in ADAM_OPTIMIZERS

  def _check_optimizer(self) -> None:
    check_fields(self, OptimizerConfig)
    if self.nesterov and self.optimizer not in ('SGD', 'LARS'):
      raise UsageError(f'--nesterov applies to SGD and LARS momentum; '
                       f'{self.optimizer} has no Nesterov form here (drop '
                       '--nesterov)')
    if self.ema_warmup and not self.ema_decay:
      raise UsageError('--ema_warmup ramps the decay of --ema_decay; give '
                       '--ema_decay too (e.g. 0.999)')


# What a run writes inside model_dir, at most, with room to spare: an
# export's variables (exports/ckpt-N/feature_vector/variables/variables.
# data-00000-of-00001, 77 characters), TensorFlow's temporary checkpoint
# names, W&B's files.
_MODEL_DIR_ROOM = 160


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """What a run writes: model_dir, checkpoints, summaries."""
  model_dir: str = option(
      '',
      'Checkpoints, summaries, exports and run_summary.json; a rerun with '
      'the same model_dir resumes. Empty: a new private directory for this '
      'run alone (tempfile.mkdtemp, named in the log), never a shared '
      'default; a job of several workers must name one.', alias='md',
      path=True)
  clean: bool = option(
      False,
      'Remove what runs wrote in model_dir before training: the files and '
      'folders of docs/run_directory.md, never anything else; a model_dir '
      'that holds anything else is refused before any work, nothing '
      'removed (the directory itself stays). Under the launcher it applies to '
      'the first attempt only: a restarted one (--max_restarts, an elastic '
      'job) resumes from the checkpoints the first wrote.')
  enable_checkpoint_and_export: bool = option(
      False,
      'Checkpoint every epoch and export a SavedModel to '
      'model_dir/saved_model at the end.')
  checkpoint_interval_steps: int = option(
      0,
      'With --enable_checkpoint_and_export: also checkpoint every N '
      'steps; 0: at every epoch end only.',
      within='>= 0')
  max_checkpoints: int = option(
      5,
      'Checkpoints kept in model_dir (oldest deleted first).',
      within='> 0')
  enable_tensorboard: bool = option(
      False,
      'Write TensorBoard summaries to model_dir/train and '
      'model_dir/eval.')
  plots: bool = option(
      True,
      'The chief draws model_dir/plots/*.png from metrics.jsonl at the end '
      'of the run (about a second: matplotlib); --noplots skips them, and '
      'python -m resnet_keras.plots MODEL_DIR draws them at any time.')
  profile_steps: Optional[Tuple[int, int]] = option(
      None,
      '"start,stop": write a TensorBoard profile of these global steps '
      'to model_dir/profile.',
      parse=_parse_pair, text=_format_pair)
  wandb: bool = option(
      False,
      "Also log metrics.jsonl's records and the config to Weights & "
      'Biases (pip install wandb); offline, under model_dir/wandb, when '
      'not logged in or offline.')
  wandb_project: str = option(
      'resnet_keras',
      'W&B project of --wandb.')
  wandb_run_name: Optional[str] = option(
      None,
      'W&B run name of --wandb; default: W&B picks one.')

  def _check_output(self) -> None:
    check_fields(self, OutputConfig)
    if self.model_dir:
      files.check_path_length('--model_dir', self.model_dir, _MODEL_DIR_ROOM)
    if self.profile_steps is not None:
      start, stop = self.profile_steps
      if not 0 <= start < stop:
        raise UsageError('--profile_steps must be "start,stop" with '
                         f'0 <= start < stop, got {start},{stop}')


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Where it runs: distribution, devices, threads."""
  distribution_strategy: str = option(
      'off',
      'off, one_device, mirrored (GPUs of one host) or '
      'multi_worker_mirrored (several processes or hosts; TF_CONFIG, or '
      'derived from the MPI rank under mpirun).', alias='ds',
      choices=DISTRIBUTION_STRATEGIES)
  use_horovod: bool = option(
      False,
      'Train with Horovod: one process per worker (started by mpirun, '
      'e.g. via demo_resnet_keras.py); --batch_size is per worker.')
  num_gpus: int = option(
      -1,
      'GPUs for mirrored/one_device; -1: every visible GPU.')
  num_cpu_replicas: int = option(
      1,
      'With -ds mirrored on a machine without GPUs: split the CPU into '
      'this many logical devices, one replica each, to try '
      'multi-replica training (per-replica batches, cross-replica '
      'reductions, sync batch norm) without GPUs. No faster: the '
      'replicas share the cores (2-core AVX2 EPYC, ResNet-18 28x28 '
      'batch 128: 87 img/s with one replica, 86 with two).',
      within='> 0')
  inter_op_parallelism_threads: int = option(
      0,
      'Threads running independent ops; 0: TensorFlow picks.',
      within='>= 0')
  intra_op_parallelism_threads: int = option(
      0,
      'Threads inside one op; 0: TensorFlow picks.',
      within='>= 0')

  def _check_runtime(self) -> None:
    if self.distribution_strategy == 'hpu':
      raise UsageError('--distribution_strategy=hpu is Gaudi-only; use '
                       'mirrored (GPUs of one host), multi_worker_mirrored '
                       '(several processes or hosts) or --use_horovod')
    check_fields(self, RuntimeConfig)
    if self.use_horovod and self.distribution_strategy != 'off':
      raise UsageError(
          f'--use_horovod and --distribution_strategy='
          f'{self.distribution_strategy} both distribute training; use one '
          '(Horovod needs --distribution_strategy=off)')
    if self.num_cpu_replicas > 1 and self.distribution_strategy != 'mirrored':
      raise UsageError(
          f'--num_cpu_replicas={self.num_cpu_replicas} splits the CPU into '
          'replicas of -ds mirrored; add --distribution_strategy=mirrored '
          f'(not {self.distribution_strategy})')


# The groups in the order the data flows: --print_config (and asdict) list
# the fields in this order.
GROUPS = (DataConfig, AugmentationConfig, DataServiceConfig, ModelConfig,
          WarmStartConfig, PrecisionConfig, LoopConfig, OptimizerConfig,
          ScheduleConfig, LossConfig, OutputConfig, RuntimeConfig)


# Bases in reverse: a dataclass lists its bases' fields from the last base
# to the first.
@dataclasses.dataclass(frozen=True)
class RunConfig(*reversed(GROUPS)):
  """Everything a run needs: one flat, frozen record of every group's
  fields, and the rules that relate groups."""

  @property
  def resize_epochs(self) -> Tuple[int, int]:
    """Progressive resizing's epochs, (first, last) counted from 0."""
    return self.progressive_resize_epochs or (0, max(self.train_epochs - 1,
                                                     0))

  def check(self) -> None:
    """Raises UsageError naming the first bad value and what is allowed."""
    self._check_data()
    self._check_augmentation()
    self._check_data_service()
    self._check_keras_application()  # Before the model's own checks.
    self._check_model()
    self._check_warm_start()
    self._check_precision()
    self._check_loop()
    self._check_optimizer()
    self._check_schedule()
    self._check_loss()
    self._check_output()
    self._check_runtime()
    self._check_across_groups()

  def _check_keras_application(self) -> None:
    """A keras.applications backbone is fixed: the options that change
    this project's ResNets (model, initialisation) do not apply."""
    if self.keras_applications_model is not None:
      for name, wished in (('norm=group', self.norm == 'group'),
                           ('sync_batch_norm', self.sync_batch_norm),
                           ('enable_recompute', self.enable_recompute),
                           ('zero_init_residual', self.zero_init_residual),
                           ('blurpool', self.blurpool),
                           ('stem_init=pca', self.stem_init == 'pca'),
                           ('drop_path_rate', self.drop_path_rate > 0),
                           ('width_multiplier', self.width_multiplier != 1),
                           ('stage_widths', bool(self.stage_widths))):
        if wished:
          raise UsageError(f'--{name} applies to this project\'s ResNets; '
                           '--keras_applications_model backbones are fixed '
                           '(drop one of the two flags)')

  def _check_across_groups(self) -> None:
    if self.single_l2_loss_op and self.uses_adam:
      raise UsageError(f'--single_l2_loss_op is an L2 loss term of SGD and '
                       f'RMSProp; {self.optimizer} decays the weights inside '
                       'the optimizer (drop --single_l2_loss_op)')
    if self.loss == 'bce' and self.enable_recompute:
      raise UsageError('--loss=bce trains on the logits of a view of the '
                       'network that --enable_recompute\'s model does not '
                       'have: drop one of the two flags')
    if self.stem_init == 'pca' and self.use_synthetic_data:
      raise UsageError('--stem_init=pca starts the stem from training '
                       'images, which --use_synthetic_data has none of: drop '
                       'one of the two flags')
    for name in ('image_size', 'eval_image_size',
                 'progressive_resize_start_size'):
      size = getattr(self, name)
      if size == 0 and name != 'image_size':  # 0: not set
        continue
      if size < self.min_image_size:
        raise UsageError(
            f'--{name}={size} is too small for ResNet with '
            f'--stem={self.stem}: it downsamples by {self.min_image_size}, '
            f'use --{name} >= {self.min_image_size} (or a stem that '
            'downsamples less)')
    if self.tf_data_service and self.skip_corrupt_records:
      raise UsageError('--skip_corrupt_records counts skipped records in the '
                       'trainer, which a tf.data service worker cannot do: '
                       'drop one of it and --tf_data_service')
    if self.tf_data_service and self.use_synthetic_data:
      raise UsageError('--use_synthetic_data makes its batches in the '
                       'trainer; --tf_data_service serves real data: drop '
                       'one of them')


def scaled_filters(filters: Tuple[int, ...],
                   multiplier: float) -> Tuple[int, ...]:
  """Each count x multiplier, to the nearest multiple of CHANNEL_MULTIPLE
  (at least one): SIMD and matmul kernels run whole vectors."""
  return tuple(max(CHANNEL_MULTIPLE,
                   CHANNEL_MULTIPLE * round(f * multiplier / CHANNEL_MULTIPLE))
               for f in filters)


_Record = TypeVar('_Record')


def from_dict(cls: Type[_Record], values: Dict[str, Any]) -> _Record:
  """Rebuilds a RunConfig or TrainingPlan from `dataclasses.asdict` JSON.

  Keys the class no longer has are ignored and missing ones take their
  defaults, so a model_dir written by another version still loads. JSON has
  no tuples; these classes hold no lists, so lists become tuples again.
  """
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: tuple(v) if isinstance(v, list) else v
                for k, v in values.items() if k in names})
