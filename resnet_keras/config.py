"""RunConfig: the one object everything downstream of the flags reads.

Its fields are defined by concern, one frozen dataclass a group (DataConfig,
ModelConfig, PrecisionConfig, LoopConfig, OptimizerConfig, OutputConfig,
RuntimeConfig); RunConfig inherits them all into one flat record (code reads
`cfg.image_size`, config.json stays one flat object) and holds the
properties and checks that span groups.

Entry points parse flags once (`resnet_keras.flags.config_from_flags`); the
library only sees a frozen `RunConfig`, so tests build configs directly and no
module reads absl's FLAGS. The batch/step arithmetic that turns a config and a
dataset's size into a training plan lives here too, as pure functions.
"""

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

from common.errors import UsageError
from resnet_keras.hardware import Machine

DATASETS = ('imagenet', 'cifar10', 'cifar100')
DTYPES = ('fp32', 'bf16', 'fp16', 'auto')
LOADER_IMAGE_TYPES = ('fp32', 'bf16', 'uint8')
OPTIMIZERS = ('SGD', 'LARS', 'RMSProp')
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
# How the stem's convolution starts (models.pca_stem_kernel).
STEM_INITS = ('random', 'pca')
KERAS_APPLICATIONS_MODELS = ('ResNet50', 'ResNet101', 'ResNet152',
                             'ResNet50V2', 'ResNet101V2', 'ResNet152V2')
DATA_SERVICE_SHARDING = ('off', 'dynamic')
DISTRIBUTION_STRATEGIES = ('off', 'one_device', 'mirrored',
                           'multi_worker_mirrored')
STAGE_STRIDE = 8

# ImageNet-1k, used for synthetic data so its step counts match real runs.
IMAGENET_NUM_CLASSES = 1000
IMAGENET_NUM_TRAIN_EXAMPLES = 1281167
IMAGENET_NUM_EVAL_EXAMPLES = 50000


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What data, how much of it, and how it is read."""
  data_dir: str = '/data/tensorflow_datasets/imagenet/tf_records'
  dataset: str = 'imagenet'
  use_synthetic_data: bool = False
  image_size: int = 224  # training's (progressive resizing: where it ends)
  eval_image_size: int = 0  # 0: image_size.
  # Progressive resizing (schedules.image_size_at); start size 0: off.
  progressive_resize_start_size: int = 0
  progressive_resize_epochs: Optional[Tuple[int, int]] = None  # None: all
  progressive_resize_multiple: int = 0  # 0: 32 from 128 px, else 4.
  data_loader_image_type: str = 'fp32'
  experimental_preloading: bool = True
  num_classes: int = 0  # 0: from the dataset.
  num_train_examples: int = 0  # 0: all of the dataset.
  num_eval_examples: int = 0
  train_crop_min_area: float = 0.05  # ImageNet's
  eval_crop_fraction: float = 224 / 256  # ImageNet's standard
  training_dataset_cache: bool = False
  datasets_num_private_threads: int = 0  # 0: tf.data's shared pool.
  skip_corrupt_records: bool = False
  # Training input from a tf.data service (data/service.py); '': local.
  tf_data_service: str = ''
  tf_data_service_job_name: str = ''  # '': from model_dir (service.job_name)
  tf_data_service_sharding: str = 'off'
  tf_data_service_timeout: int = 300  # seconds without a batch; 0: wait
  tf_data_service_workers: int = 0  # how many the launcher started; 0: ?


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The network, and where its weights start (warm_start.py)."""
  resnet_depth: int = 50
  stem: str = 'imagenet'
  keras_applications_model: Optional[str] = None
  width_multiplier: float = 1.0  # channels of every layer x this
  conv_impl: str = 'auto'  # auto: see uses_matmul_convs.
  relu_impl: str = 'auto'  # auto: see residual_relu.
  norm: str = 'batch'
  groups: int = 32  # --norm=group only.
  sync_batch_norm: bool = False
  enable_recompute: bool = False
  # The last norm of each residual branch starts at gamma 0 (Goyal et al.).
  zero_init_residual: bool = False
  # Anti-aliased downsampling (models.Blur; Zhang 2019, as FFCV applies it).
  blurpool: bool = False
  # pca: the stem's filters start as the principal directions of training
  # images' patches (airbench's whitening, as an initialisation).
  stem_init: str = 'random'
  # Where the weights start when model_dir has no checkpoint (warm_start.py).
  restore_from: Optional[str] = None
  restore_optimizer: bool = False
  pretrained_checkpoint: Optional[str] = None
  freeze_backbone: bool = False


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
  """Numeric precision and compilation."""
  dtype: str = 'fp32'
  loss_scale: float = 0.0  # 0: dynamic loss scaling (fp16 only).
  enable_xla: bool = False


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How long training runs; when and how it logs, evaluates and stops."""
  batch_size: int = 256
  train_epochs: int = 1
  train_steps: int = 0  # 0: no cap on steps per epoch.
  steps_per_loop: int = 50
  num_accumulation_steps: int = 1  # micro-batches per optimizer step
  log_steps: int = 100
  epochs_between_evals: int = 1
  eval_offset_epochs: int = 0  # first eval epoch; 0: epochs_between_evals
  skip_eval: bool = False
  eval_flip: bool = False  # Test-time flip averaging (trainer.flip_average).
  target_accuracy: float = 0.0  # 0: never stop early.
  global_seed: Optional[int] = None
  use_tf_function: bool = True
  use_tf_while_loop: bool = True


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer, its learning-rate schedule and the loss terms."""
  optimizer: str = 'SGD'
  base_learning_rate: float = 0.1
  warmup_epochs: float = 5.0
  lr_schedule: str = 'piecewise'
  lr_per_epoch: bool = False  # a new learning rate an epoch, not a step
  end_learning_rate: float = 1e-4
  lars_decay_epochs: float = 0.0  # 0: decay over the whole run.
  lars_epsilon: float = 0.0
  momentum: float = 0.9
  nesterov: bool = False
  rmsprop_rho: float = 0.9
  rmsprop_epsilon: float = 1e-3
  lr_decay_factor: float = 0.1  # stepped and exponential schedules.
  lr_decay_points: Tuple[float, ...] = (0.3, 0.6, 0.8)  # Fractions of the run.
  lr_decay_epochs: float = 30.0
  label_smoothing: float = 0.0
  weight_decay: float = 1e-4
  single_l2_loss_op: bool = False
  # An average of the weights kept during training (weight_average.py).
  ema_decay: float = 0.0  # 0: none.
  ema_warmup: bool = False


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """What a run writes: model_dir, checkpoints, summaries."""
  model_dir: str = '/tmp/resnet'
  clean: bool = False
  enable_checkpoint_and_export: bool = False
  checkpoint_interval_steps: int = 0  # 0: at every epoch end.
  max_checkpoints: int = 5
  enable_tensorboard: bool = False
  profile_steps: Optional[Tuple[int, int]] = None
  wandb: bool = False  # Mirror metrics.jsonl to Weights & Biases.
  wandb_project: str = 'resnet_keras'
  wandb_run_name: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Where it runs: distribution, devices, threads."""
  distribution_strategy: str = 'off'
  use_horovod: bool = False
  num_gpus: int = -1  # -1: every visible GPU.
  # > 1: -ds mirrored over this many logical devices of the CPU.
  num_cpu_replicas: int = 1
  inter_op_parallelism_threads: int = 0  # 0: chosen from the machine.
  intra_op_parallelism_threads: int = 0


# Bases in reverse: a dataclass lists its bases' fields from the last base
# to the first, so config.json, --print_config and asdict keep the order
# the data flows in (data first).
@dataclasses.dataclass(frozen=True)
class RunConfig(RuntimeConfig, OutputConfig, OptimizerConfig, LoopConfig,
                PrecisionConfig, ModelConfig, DataConfig):
  """Everything a run needs: one flat, frozen record of every group's
  fields (each group a class above, by concern), and the rules that
  span groups."""

  @property
  def min_image_size(self) -> int:
    """Smallest input for which the last stage still sees 1x1."""
    if self.keras_applications_model:
      return STAGE_STRIDE * STEM_STRIDES['imagenet']
    return STAGE_STRIDE * STEM_STRIDES[self.stem]

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
  def resize_epochs(self) -> Tuple[int, int]:
    """Progressive resizing's epochs, (first, last) counted from 0."""
    return self.progressive_resize_epochs or (0, max(self.train_epochs - 1,
                                                     0))

  @property
  def resize_multiple(self) -> int:
    return self.progressive_resize_multiple or (
        32 if self.image_size >= 128 else 4)

  @property
  def model_name(self) -> str:
    if self.keras_applications_model:
      return self.keras_applications_model
    width = ('' if self.width_multiplier == 1 else
             f'_w{self.width_multiplier:g}')
    return f'resnet{self.resnet_depth}{width}'

  @property
  def stage_filters(self) -> Tuple[int, ...]:
    return scaled_filters(STAGE_FILTERS, self.width_multiplier)

  def uses_matmul_convs(self, machine: Machine) -> bool:
    """Whether models.MatmulConv2D runs the convolutions. auto, by levers.py
    (benchmarks/README.md): on CPUs for bf16 (AMX 1.13x, AVX2 1.22x), and
    for fp32 on CPUs without AVX-512 (AVX2: 1.02-1.16x; no gain with
    AVX-512); GPUs keep cuDNN."""
    if self.conv_impl == 'auto':
      return not machine.has_gpu and (
          self.dtype == 'bf16' or 'avx512f' not in machine.cpu.features)
    return self.conv_impl == 'matmul'

  def residual_relu(self, machine: Machine) -> str:
    """How the ReLUs after the residual adds train: native, bitwise or xla
    (models.ResidualRelu). auto: xla for bf16 on CPUs (levers.py: AMX
    1.07x, AVX2 1.05x; fp32 0.90x on AVX2), else tf.nn.relu."""
    if self.relu_impl == 'auto':
      return ('xla' if self.dtype == 'bf16' and not machine.has_gpu
              else 'native')
    return self.relu_impl

  @property
  def norm_name(self) -> str:
    """'batch' or 'group<groups>': what the normalisation weights of a
    checkpoint mean (sync batch norm has batch norm's)."""
    return f'group{self.groups}' if self.norm == 'group' else self.norm

  def _validate_data_service(self) -> None:
    _check_choice('tf_data_service_sharding', self.tf_data_service_sharding,
                  DATA_SERVICE_SHARDING)
    for name in ('tf_data_service_timeout', 'tf_data_service_workers'):
      if getattr(self, name) < 0:
        raise UsageError(f'--{name} must be >= 0, got {getattr(self, name)}')
    if not self.tf_data_service:
      return
    if self.skip_corrupt_records:
      raise UsageError('--skip_corrupt_records counts skipped records in the '
                       'trainer, which a tf.data service worker cannot do: '
                       'drop one of it and --tf_data_service')
    if self.use_synthetic_data:
      raise UsageError('--use_synthetic_data makes its batches in the '
                       'trainer; --tf_data_service serves real data: drop '
                       'one of them')

  @property
  def uses_lars(self) -> bool:
    return self.optimizer == 'LARS'

  def validate(self) -> None:
    """Raises UsageError naming the first bad value and what is allowed."""
    _check_choice('dataset', self.dataset, DATASETS)
    _check_choice('dtype', self.dtype, DTYPES)
    _check_choice('data_loader_image_type', self.data_loader_image_type,
                  LOADER_IMAGE_TYPES)
    _check_choice('optimizer', self.optimizer, OPTIMIZERS)
    _check_choice('lr_schedule', self.lr_schedule, LR_SCHEDULES)
    _check_choice('resnet_depth', self.resnet_depth, RESNET_DEPTHS)
    _check_choice('stem', self.stem, tuple(STEM_STRIDES))
    _check_choice('stem_init', self.stem_init, STEM_INITS)
    _check_choice('conv_impl', self.conv_impl, CONV_IMPLS)
    _check_choice('relu_impl', self.relu_impl, RELU_IMPLS)
    _check_choice('norm', self.norm, NORMS)
    self._validate_model_options()
    self._validate_data_service()
    if self.distribution_strategy == 'hpu':
      raise UsageError('--distribution_strategy=hpu is Gaudi-only; use '
                       'mirrored (GPUs of one host), multi_worker_mirrored '
                       '(several processes or hosts) or --use_horovod')
    _check_choice('distribution_strategy', self.distribution_strategy,
                  DISTRIBUTION_STRATEGIES)
    if self.use_horovod and self.distribution_strategy != 'off':
      raise UsageError(
          f'--use_horovod and --distribution_strategy='
          f'{self.distribution_strategy} both distribute training; use one '
          '(Horovod needs --distribution_strategy=off)')
    _check_positive('num_cpu_replicas', self.num_cpu_replicas)
    if self.num_cpu_replicas > 1 and self.distribution_strategy != 'mirrored':
      raise UsageError(
          f'--num_cpu_replicas={self.num_cpu_replicas} splits the CPU into '
          'replicas of -ds mirrored; add --distribution_strategy=mirrored '
          f'(not {self.distribution_strategy})')
    if self.keras_applications_model is not None:
      _check_choice('keras_applications_model', self.keras_applications_model,
                    KERAS_APPLICATIONS_MODELS)
    _check_positive('batch_size', self.batch_size)
    _check_positive('train_epochs', self.train_epochs)
    _check_positive('steps_per_loop', self.steps_per_loop)
    _check_positive('num_accumulation_steps', self.num_accumulation_steps)
    _check_positive('log_steps', self.log_steps)
    _check_positive('epochs_between_evals', self.epochs_between_evals)
    _check_positive('max_checkpoints', self.max_checkpoints)
    for name in ('train_steps', 'num_classes', 'num_train_examples',
                 'checkpoint_interval_steps', 'eval_offset_epochs',
                 'datasets_num_private_threads',
                 'num_eval_examples', 'inter_op_parallelism_threads',
                 'intra_op_parallelism_threads'):
      if getattr(self, name) < 0:
        raise UsageError(f'--{name} must be >= 0, got {getattr(self, name)}')
    if self.num_classes == 1:
      raise UsageError('--num_classes=1 cannot be trained as a classifier; '
                       'use 0 (from the data) or >= 2')
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
    self._validate_progressive_resize()
    if self.base_learning_rate <= 0:
      raise UsageError('--base_learning_rate must be > 0, got '
                       f'{self.base_learning_rate}')
    for name in ('warmup_epochs', 'end_learning_rate', 'lars_decay_epochs',
                 'lars_epsilon', 'weight_decay', 'loss_scale'):
      if getattr(self, name) < 0:
        raise UsageError(f'--{name} must be >= 0, got {getattr(self, name)}')
    if not 0 < self.eval_crop_fraction <= 1:
      raise UsageError('--eval_crop_fraction is a fraction in (0, 1], got '
                       f'{self.eval_crop_fraction}')
    if not 0 < self.train_crop_min_area <= 1:
      raise UsageError('--train_crop_min_area is a fraction in (0, 1], got '
                       f'{self.train_crop_min_area}')
    if not 0 <= self.momentum < 1:
      raise UsageError(f'--momentum must be in [0, 1), got {self.momentum}')
    self._validate_optimizer_options()
    if not 0 <= self.ema_decay < 1:
      raise UsageError('--ema_decay is the decay of the weight average, in '
                       f'[0, 1) (0: none), got {self.ema_decay}')
    if self.ema_warmup and not self.ema_decay:
      raise UsageError('--ema_warmup ramps the decay of --ema_decay; give '
                       '--ema_decay too (e.g. 0.999)')
    if not 0 <= self.label_smoothing < 1:
      raise UsageError('--label_smoothing must be in [0, 1), got '
                       f'{self.label_smoothing}')
    if not 0 <= self.target_accuracy <= 1:
      raise UsageError('--target_accuracy is a fraction in [0, 1], got '
                       f'{self.target_accuracy}')
    if self.use_tf_while_loop and not self.use_tf_function:
      raise UsageError('--use_tf_while_loop needs --use_tf_function; pass '
                       '--nouse_tf_while_loop to run steps from Python')
    if self.profile_steps is not None:
      start, stop = self.profile_steps
      if not 0 <= start < stop:
        raise UsageError('--profile_steps must be "start,stop" with '
                         f'0 <= start < stop, got {start},{stop}')
    self._validate_warm_start()

  def _validate_progressive_resize(self) -> None:
    if self.progressive_resize_multiple < 0:
      raise UsageError('--progressive_resize_multiple must be >= 0 (0: '
                       f'auto), got {self.progressive_resize_multiple}')
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

  def _validate_warm_start(self) -> None:
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

  def _validate_model_options(self) -> None:
    if self.keras_applications_model is not None:
      for name, wished in (('norm=group', self.norm == 'group'),
                           ('sync_batch_norm', self.sync_batch_norm),
                           ('enable_recompute', self.enable_recompute),
                           ('zero_init_residual', self.zero_init_residual),
                           ('blurpool', self.blurpool),
                           ('stem_init=pca', self.stem_init == 'pca')):
        if wished:
          raise UsageError(f'--{name} applies to this project\'s ResNets; '
                           '--keras_applications_model backbones have plain '
                           'batch norm (drop one of the two flags)')
    if self.stem_init == 'pca' and self.use_synthetic_data:
      raise UsageError('--stem_init=pca starts the stem from training '
                       'images, which --use_synthetic_data has none of: drop '
                       'one of the two flags')
    if self.width_multiplier <= 0:
      raise UsageError('--width_multiplier must be > 0, got '
                       f'{self.width_multiplier}')
    if self.keras_applications_model and self.width_multiplier != 1:
      raise UsageError('--width_multiplier applies to this project\'s '
                       'ResNets; --keras_applications_model backbones have '
                       'fixed widths (drop one of the two flags)')
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

  def _validate_optimizer_options(self) -> None:
    if self.nesterov and self.optimizer == 'RMSProp':
      raise UsageError('--nesterov applies to SGD and LARS momentum; '
                       'RMSProp has no Nesterov form here (drop --nesterov)')
    if not 0 <= self.rmsprop_rho < 1:
      raise UsageError(f'--rmsprop_rho must be in [0, 1), got '
                       f'{self.rmsprop_rho}')
    if self.rmsprop_epsilon <= 0:
      raise UsageError(f'--rmsprop_epsilon must be > 0, got '
                       f'{self.rmsprop_epsilon}')
    if not 0 < self.lr_decay_factor <= 1:
      raise UsageError(f'--lr_decay_factor must be in (0, 1], got '
                       f'{self.lr_decay_factor}')
    _check_positive('lr_decay_epochs', self.lr_decay_epochs)
    points = tuple(self.lr_decay_points)
    if not (points and all(0 < p < 1 for p in points) and
            list(points) == sorted(set(points))):
      raise UsageError(
          '--lr_decay_points must be increasing fractions of the run in '
          f'(0, 1), e.g. 0.3,0.6,0.8; got {",".join(map(str, points))}')


def scaled_filters(filters: Tuple[int, ...],
                   multiplier: float) -> Tuple[int, ...]:
  """Each count x multiplier, to the nearest multiple of CHANNEL_MULTIPLE
  (at least one): SIMD and matmul kernels run whole vectors."""
  return tuple(max(CHANNEL_MULTIPLE,
                   CHANNEL_MULTIPLE * round(f * multiplier / CHANNEL_MULTIPLE))
               for f in filters)


def _check_choice(name, value, allowed):
  if value not in allowed:
    allowed_text = ', '.join(str(a) for a in allowed)
    raise UsageError(f'--{name}={value} is not supported; use one of: '
                     f'{allowed_text}')


def _check_positive(name, value):
  if value <= 0:
    raise UsageError(f'--{name} must be > 0, got {value}')


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
  """How many steps of what size: derived from a config, a dataset and the
  job's layout. It owns every batch size of the run (see make_training_plan).
  """
  global_batch_size: int  # Examples per optimizer step, over the whole job.
  steps_per_epoch: int
  total_train_steps: int
  steps_per_loop: int
  eval_interval_steps: int
  eval_steps: int
  num_eval_examples: int
  checkpoint_interval_steps: int = 0  # 0: epoch ends only.
  first_eval_step: int = 0  # 0: at eval_interval_steps.
  # Programs that each drive their own replicas: Horovod's workers; a
  # tf.distribute job is one program, its strategy spans every worker.
  num_programs: int = 1
  replicas_per_program: int = 1
  num_micro_batches: int = 1  # --num_accumulation_steps

  @property
  def program_batch_size(self) -> int:
    """The batch one program's replicas share (per worker under Horovod)."""
    return self.global_batch_size // self.num_programs

  @property
  def replica_batch_size(self) -> int:
    return self.program_batch_size // self.replicas_per_program

  @property
  def micro_batch_size(self) -> int:
    """What a replica computes at once with gradient accumulation."""
    return self.replica_batch_size // self.num_micro_batches

  @property
  def num_replicas(self) -> int:
    """Replicas over the whole job."""
    return self.num_programs * self.replicas_per_program

  def epoch_of(self, step: int) -> float:
    return step / self.steps_per_epoch

  def is_eval_step(self, step: int) -> bool:
    """The first eval step, every interval after it, and the end."""
    first = self.first_eval_step or self.eval_interval_steps
    return step == self.total_train_steps or (
        step >= first and (step - first) % self.eval_interval_steps == 0)

  def is_checkpoint_step(self, step: int) -> bool:
    """Epoch ends, multiples of the checkpoint interval, and the end."""
    return (step % self.steps_per_epoch == 0 or
            step == self.total_train_steps or
            bool(self.checkpoint_interval_steps and
                 step % self.checkpoint_interval_steps == 0))

  def next_stop(self, step: int) -> int:
    """The next step after `step` where the host checkpoints or evaluates."""
    stops = [(step // self.steps_per_epoch + 1) * self.steps_per_epoch,
             self.total_train_steps]
    if self.checkpoint_interval_steps:
      interval = self.checkpoint_interval_steps
      stops.append((step // interval + 1) * interval)
    return min(stops)


_Record = TypeVar('_Record', RunConfig, TrainingPlan)


def from_dict(cls: Type[_Record], values: Dict[str, Any]) -> _Record:
  """Rebuilds a RunConfig or TrainingPlan from `dataclasses.asdict` JSON.

  Keys the class no longer has are ignored and missing ones take their
  defaults, so a model_dir written by another version still loads. JSON has
  no tuples; these classes hold no lists, so lists become tuples again.
  """
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: tuple(v) if isinstance(v, list) else v
                for k, v in values.items() if k in names})


def make_training_plan(cfg: RunConfig, num_train_examples: int,
                       num_eval_examples: int, num_programs: int = 1,
                       replicas_per_program: int = 1) -> TrainingPlan:
  """Turns dataset sizes and the job's layout into batch sizes and steps.

  `--batch_size` is per worker under Horovod (num_programs > 1 processes
  that each see a shard) and global for a tf.distribute job (one program
  drives every replica): the rule is applied here, once. Training drops the
  last partial batch of an epoch; evaluation covers every example.
  """
  global_batch = cfg.batch_size * num_programs
  steps_per_epoch = num_train_examples // global_batch
  if steps_per_epoch == 0:
    raise UsageError(
        f'the global batch ({global_batch}) is larger than the training set '
        f'({num_train_examples} examples); lower --batch_size')
  if cfg.batch_size % replicas_per_program:
    raise UsageError(
        f'--batch_size={cfg.batch_size} is the global batch and must '
        f'be divisible by the {replicas_per_program} replicas')
  replica_batch = cfg.batch_size // replicas_per_program
  if replica_batch % cfg.num_accumulation_steps:
    raise UsageError(
        f'each replica\'s batch of {replica_batch} cannot be split into '
        f'--num_accumulation_steps={cfg.num_accumulation_steps} equal '
        'micro-batches; use a --batch_size that is a multiple of '
        f'{replicas_per_program * cfg.num_accumulation_steps}')
  if cfg.train_steps:
    steps_per_epoch = min(steps_per_epoch, cfg.train_steps)
  return TrainingPlan(
      global_batch_size=global_batch,
      steps_per_epoch=steps_per_epoch,
      total_train_steps=steps_per_epoch * cfg.train_epochs,
      steps_per_loop=min(cfg.steps_per_loop, steps_per_epoch),
      eval_interval_steps=steps_per_epoch * cfg.epochs_between_evals,
      first_eval_step=steps_per_epoch * cfg.eval_offset_epochs,
      eval_steps=math.ceil(num_eval_examples / global_batch),
      num_eval_examples=num_eval_examples,
      checkpoint_interval_steps=cfg.checkpoint_interval_steps,
      num_programs=num_programs, replicas_per_program=replicas_per_program,
      num_micro_batches=cfg.num_accumulation_steps)
