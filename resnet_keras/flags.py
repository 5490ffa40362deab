"""Command-line flags of resnet_ctl_imagenet_main.py, defined once.

One function per concern, in the order the data flows (recipe, data, model,
precision, loop, optimizer, outputs, distribution); the tools define their
own few flags. A flag of a RunConfig field takes the field's default, so the
command line and the library cannot disagree. Short aliases follow the
reference README (-dd, -md, -te, -ebe, -bs, -dt, -dlit, -synth, -ds).
Entry points' mains pass their parsed FLAGS to `apply_config` and
`config_from_flags`; everything else takes a RunConfig.
"""

import dataclasses
from typing import Any, Collection, Dict, Optional, Tuple

from absl import flags

from resnet_keras import recipes
from resnet_keras.config import RunConfig
from common.errors import UsageError

_D = RunConfig()  # Defaults live in one place: the dataclass.


def _alias(values: flags.FlagValues, short: str, name: str) -> None:
  flags.DEFINE_alias(short, name, flag_values=values)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines every flag of the trainer in `values` (once)."""
  _define_recipe_flags(values)
  _define_data_flags(values)
  _define_model_flags(values)
  _define_precision_flags(values)
  _define_loop_flags(values)
  _define_optimizer_flags(values)
  _define_output_flags(values)
  _define_distribution_flags(values)


def _define(values: flags.FlagValues, define, name: str,
            help_text: str) -> None:
  """`define`s the flag of RunConfig's field `name` with the field's
  default: the one place the default is stated."""
  define(name, getattr(_D, name), help_text, flag_values=values)


def _define_recipe_flags(values: flags.FlagValues) -> None:
  """The --config recipe and --print_config."""
  flags.DEFINE_string('config', None,
                      'A recipe: NAME of configs/NAME.yaml (e.g. '
                      'resnet50_lars_1worker) or a YAML file of flag: value '
                      'lines. Flags given on the command line override it.',
                      flag_values=values)
  flags.DEFINE_boolean('print_config', False,
                       'Print the effective configuration (flags, recipe and '
                       'defaults merged) as YAML and exit.',
                       flag_values=values)


def _define_data_flags(values: flags.FlagValues) -> None:
  """What data, how much of it, and how it is read."""
  _define(values, flags.DEFINE_string, 'data_dir',
          'Directory with the TFRecord shards.')
  _alias(values, 'dd', 'data_dir')
  _define(values, flags.DEFINE_string, 'dataset',
          'imagenet (any ImageNet-format TFRecords), cifar10 or cifar100 '
          '(the standard binary files in --data_dir).')
  _define(values, flags.DEFINE_boolean, 'use_synthetic_data',
          'Train on random images held in memory (no files).')
  _alias(values, 'synth', 'use_synthetic_data')
  _define(values, flags.DEFINE_integer, 'image_size',
          'Height and width of the model input (>= 32 with the imagenet '
          'stem, 16 small, 8 cifar); with progressive resizing, the size it '
          'ends at.')
  _define(values, flags.DEFINE_integer, 'eval_image_size',
          'Height and width of evaluation\'s (and the export\'s) input; 0: '
          '--image_size. Larger than the training size makes up for the '
          'random crops\' zoom (FixRes; FFCV trains at 192 and tests at '
          '256).')
  _define(values, flags.DEFINE_integer, 'progressive_resize_start_size',
          'Progressive resizing: training starts at this height and width '
          'and rises to --image_size over --progressive_resize_epochs, in '
          'steps of --progressive_resize_multiple; 0: off.')
  flags.DEFINE(_NumberListParser(int), 'progressive_resize_epochs',
               _D.progressive_resize_epochs,
               '"START,END": the size rises from the start size at epoch '
               'START (counted from 0) to --image_size at epoch END; '
               'default: over the whole run.',
               serializer=flags.CsvListSerializer(','), flag_values=values)
  _define(values, flags.DEFINE_integer, 'progressive_resize_multiple',
          'Progressive sizes are multiples of this; 0: 32 for images of '
          '128 px or more, else 4.')
  _define(values, flags.DEFINE_string, 'data_loader_image_type',
          'dtype images leave the input pipeline in: fp32, bf16, or uint8 '
          '(cast and mean subtraction run on the device).')
  _alias(values, 'dlit', 'data_loader_image_type')
  _define(values, flags.DEFINE_boolean, 'experimental_preloading',
          'Prefetch batches to the accelerator (prefetch_to_device); a no-op '
          'on CPU.')
  _define(values, flags.DEFINE_integer, 'num_classes',
          'Output units; 0: from the dataset (synthetic: 1000).')
  _define(values, flags.DEFINE_integer, 'num_train_examples',
          'Use only the first N training examples; 0: all (synthetic: '
          'ImageNet\'s 1,281,167).')
  _define(values, flags.DEFINE_integer, 'num_eval_examples',
          'Use only the first N validation examples; 0: all (synthetic: '
          'ImageNet\'s 50,000).')
  _define(values, flags.DEFINE_float, 'train_crop_min_area',
          'Smallest fraction of an image a random training crop covers '
          '(0.05: ImageNet; larger for small images).')
  _define(values, flags.DEFINE_float, 'eval_crop_fraction',
          'Evaluation keeps this central fraction of the short side (0.875 = '
          '224/256, ImageNet\'s standard; 1.0 for small images centred in '
          'their frame).')
  _define(values, flags.DEFINE_boolean, 'skip_corrupt_records',
          'Skip unreadable TFRecord records and undecodable images (counted '
          'and reported at the end) instead of stopping with an error that '
          'names the file.')
  _define(values, flags.DEFINE_boolean, 'training_dataset_cache',
          'Cache the training records in memory after the first epoch (for '
          'datasets that fit in RAM). With --train_crop_min_area=1 (no '
          'crop) the decoded, resized images are cached instead, and only '
          'the flip runs per epoch.')
  _define(values, flags.DEFINE_integer, 'datasets_num_private_threads',
          'Threads of a private tf.data pool for the input pipeline; 0: '
          'tf.data\'s shared pool.')
  _define(values, flags.DEFINE_string, 'tf_data_service',
          'grpc://HOST:PORT of a tf.data service dispatcher: the training '
          'input pipeline runs on its workers (python -m '
          'resnet_keras.data.service); evaluation stays here. Empty: local.')
  _define(values, flags.DEFINE_string, 'tf_data_service_job_name',
          'The tf.data service job the run\'s workers share (each gets '
          'other batches); empty: one named after --model_dir. Each resume '
          'and image size gets a job of its own under it.')
  _define(values, flags.DEFINE_string, 'tf_data_service_sharding',
          'off: every data worker serves the whole shuffled stream (batches '
          'at least once; survives a lost data worker); dynamic: files '
          'split among data workers (each record once an epoch).')
  _define(values, flags.DEFINE_integer, 'tf_data_service_timeout',
          'Seconds training may wait for one batch from the tf.data service '
          'before the run ends naming it; 0: wait for it.')
  _define(values, flags.DEFINE_integer, 'tf_data_service_workers',
          'How many data workers serve the run (set by demo_resnet_keras.py '
          '--data_service_hosts; recorded, 0: not known).')


def _define_model_flags(values: flags.FlagValues) -> None:
  """The network, and where its weights start."""
  _define(values, flags.DEFINE_integer, 'resnet_depth',
          'ResNet v1.5 depth: 10, 18, 34, 50, 101 or 152 (10: one basic '
          'block per stage).')
  _define(values, flags.DEFINE_string, 'stem',
          'First layers before the residual stages: imagenet (7x7/2 conv + '
          '3x3/2 max pool), small (3x3/1 conv + max pool: for 28-64 px '
          'images, 4x the compute at the same size) or cifar (3x3/1 conv, no '
          'pool: 16x).')
  _define(values, flags.DEFINE_string, 'keras_applications_model',
          'Use a keras.applications backbone instead: ResNet50, ResNet101, '
          'ResNet152, ResNet50V2, ResNet101V2, ResNet152V2.')
  _define(values, flags.DEFINE_float, 'width_multiplier',
          'Channels of every layer x this, rounded to multiples of 8 '
          '(Wide-ResNet\'s k; below 1 for a cheaper model): 0.25 trains '
          'ResNet-18 on 28x28 images several times faster on CPUs '
          '(configs/fashion_mnist_resnet18_w025.yaml). 1: the standard '
          'ResNet.')
  _define(values, flags.DEFINE_boolean, 'zero_init_residual',
          'Start the scale (gamma) of the last normalisation in each '
          'residual branch at 0, so every block begins as its shortcut and '
          'the network as a shallow one (Goyal et al., "ImageNet in 1 '
          'hour"). Only the initial values change: checkpoints and exports '
          'are the same either way.')
  _define(values, flags.DEFINE_boolean, 'blurpool',
          'Anti-aliased downsampling (BlurPool, as in FFCV\'s ResNets): '
          'inputs of strided convolutions blurred by a fixed 3x3 binomial '
          'filter, the stem\'s max pooling at stride 1 then blurred and '
          'subsampled. No new weights; part of the model\'s identity for '
          'resume and warm start.')
  _define(values, flags.DEFINE_string, 'stem_init',
          'How the stem\'s convolution starts: random (He normal) or pca: '
          'its filters, in +/- pairs, are the principal directions of '
          'patches of the first training images (as many as the patches\' '
          'rank and half the filters allow; the rest stay random), so its '
          'channels start decorrelated instead of all seeing the local '
          'brightness (airbench\'s whitening, as an initialisation: the '
          'filters keep training). Only the initial values change.')
  _define(values, flags.DEFINE_string, 'conv_impl',
          'How convolutions run: native (oneDNN/cuDNN), matmul (1x1 '
          'convolutions as one matmul, and kernel gradients of 3x3 '
          'convolutions on maps <= 7x7 with >= 256 channels as patches x '
          'matmul: much faster in bf16 on CPUs with AMX), or auto (matmul '
          'for bf16 on CPUs, and for fp32 on CPUs without AVX-512). Same '
          'weights and results either way.')
  _define(values, flags.DEFINE_string, 'relu_impl',
          'How the ReLU after each residual add runs in training: native '
          '(tf.nn.relu), xla (the add and the ReLU as one XLA-compiled '
          'kernel, same results: ~7% faster ResNet-50 training in bf16 on '
          'CPUs), bitwise (an integer max on the floats\' bits, no XLA; same '
          'results except that a negative NaN becomes 0), or auto (xla for '
          'bf16 on CPUs). Evaluation and export always run tf.nn.relu.')
  _define(values, flags.DEFINE_string, 'norm',
          'Normalisation after each convolution: batch, or group '
          '(GroupNormalization: independent of the batch, for small '
          'per-replica batches; no moving statistics).')
  _define(values, flags.DEFINE_integer, 'groups',
          '--norm=group: channel groups per layer; must divide 64 (every '
          'channel count of the ResNets).')
  _define(values, flags.DEFINE_boolean, 'sync_batch_norm',
          'Batch statistics over the global batch (all-reduced across '
          'tf.distribute replicas, or Horovod workers) instead of each '
          'replica\'s own batch.')
  _define(values, flags.DEFINE_boolean, 'enable_recompute',
          'Keep only each residual stage\'s input during the forward pass '
          'and recompute its activations in the backward pass '
          '(tf.recompute_grad): less memory for about one more forward pass '
          'of compute.')
  _define(values, flags.DEFINE_string, 'restore_from',
          'Start a new run from another run\'s checkpoint (a checkpoint '
          'prefix such as DIR/ckpt-8, or a model_dir: its latest) of the '
          'same model; only while --model_dir has no checkpoint of its own '
          '(then it resumes).')
  _define(values, flags.DEFINE_boolean, 'restore_optimizer',
          'With --restore_from: also restore the optimizer (momentum slots, '
          'step, loss scale), so training goes on from that step; default: '
          'weights only, step 0.')
  _define(values, flags.DEFINE_string, 'pretrained_checkpoint',
          'Transfer learning: load every layer but the classification head '
          'from another run\'s checkpoint (prefix or model_dir) of the same '
          'architecture; the head is new, for this data\'s classes.')
  _define(values, flags.DEFINE_boolean, 'freeze_backbone',
          'With --pretrained_checkpoint: train only the head; the '
          'backbone\'s batch norm keeps its pretrained statistics (inference '
          'mode).')


def _define_precision_flags(values: flags.FlagValues) -> None:
  """Compute precision and compilation."""
  _define(values, flags.DEFINE_string, 'dtype',
          'Compute precision: fp32, bf16 (mixed_bfloat16; fast on CPUs with '
          'AMX-BF16/AVX512_BF16 and on GPUs of compute capability >= 8.0, '
          'emulated and slower than fp32 on other CPUs), fp16 (mixed_float16 '
          'with loss scaling; GPU only in practice), or auto (bf16 where it '
          'is fast, fp16 on older GPUs, fp32 elsewhere; the choice and why '
          'are logged and recorded in config.json).')
  _alias(values, 'dt', 'dtype')
  _define(values, flags.DEFINE_float, 'loss_scale',
          'fp16: a fixed loss scale; 0: dynamic loss scaling.')
  flags.DEFINE_boolean('use_keras_mixed_precision', False,
                       'Accepted for compatibility: the Keras mixed-precision '
                       'policy is the only bf16/fp16 path here.',
                       flag_values=values)
  _define(values, flags.DEFINE_boolean, 'enable_xla',
          'Compile with XLA (auto-clustering). For GPUs; on CPUs it is '
          'slower than the default oneDNN kernels.')


def _define_loop_flags(values: flags.FlagValues) -> None:
  """The batch, how long to train, and the cadence of loops, logs
  and evaluations."""
  _define(values, flags.DEFINE_integer, 'batch_size',
          'Global batch size (tf.distribute); per worker with Horovod.')
  _alias(values, 'bs', 'batch_size')
  _define(values, flags.DEFINE_integer, 'train_epochs',
          'Number of training epochs.')
  _alias(values, 'te', 'train_epochs')
  _define(values, flags.DEFINE_integer, 'train_steps',
          'Cap on steps per epoch; 0: the whole training set.')
  _define(values, flags.DEFINE_integer, 'steps_per_loop',
          'Steps run on the device per host call (one tf.function); capped '
          'at steps per epoch.')
  _define(values, flags.DEFINE_integer, 'num_accumulation_steps',
          'Split each step\'s batch into this many micro-batches and sum '
          'their gradients (float32) before one optimizer update: '
          '--batch_size stays the batch per update (for the LR, schedule and '
          'logs) while memory holds one micro-batch.')
  _define(values, flags.DEFINE_integer, 'log_steps',
          'Print a status line every N steps.')
  _define(values, flags.DEFINE_integer, 'epochs_between_evals',
          'Evaluate every N epochs (and at the end).')
  _alias(values, 'ebe', 'epochs_between_evals')
  _define(values, flags.DEFINE_integer, 'eval_offset_epochs',
          'Epoch of the first evaluation, then every --epochs_between_evals '
          '(MLPerf style: e.g. 3 with 4 evaluates after epochs 3, 7, 11, '
          '...); 0: first at --epochs_between_evals. The end is always '
          'evaluated.')
  _define(values, flags.DEFINE_boolean, 'skip_eval', 'Do not evaluate.')
  _define(values, flags.DEFINE_boolean, 'eval_flip',
          'Evaluate each image and its mirror image and average their '
          'logits (test-time flip augmentation; each image counts once). '
          'Evaluations, and python -m resnet_keras.validate on the run, '
          'report the averaged predictions.')
  _define(values, flags.DEFINE_float, 'target_accuracy',
          'Stop once eval top-1 accuracy reaches this fraction; 0: never '
          'stop early.')
  _define(values, flags.DEFINE_integer, 'global_seed',
          'Seed for weights, data order and augmentation (deterministic '
          'input order; TensorFlow\'s op determinism stays off): on CPUs two '
          'runs with the same flags log the same losses step by step, and a '
          'resumed run continues exactly.')
  _define(values, flags.DEFINE_boolean, 'use_tf_function',
          'Compile steps with tf.function (off: eager, for debugging).')
  _define(values, flags.DEFINE_boolean, 'use_tf_while_loop',
          'Run the steps of a loop inside one tf.function (tf.range); off: '
          'one host call per step.')


def _define_optimizer_flags(values: flags.FlagValues) -> None:
  """The optimizer, its learning-rate schedule and weight decay."""
  _define(values, flags.DEFINE_string, 'optimizer',
          'SGD (momentum), LARS or RMSProp.')
  _define(values, flags.DEFINE_float, 'base_learning_rate',
          'SGD and RMSProp: learning rate per 256 images (scaled by global '
          'batch / 256); LARS: the peak learning rate as is.')
  _define(values, flags.DEFINE_float, 'warmup_epochs',
          'Epochs of linear warmup from 0 to the peak.')
  _define(values, flags.DEFINE_string, 'lr_schedule',
          'piecewise (x0.1 at epochs 30/60/80), polynomial (power 2), '
          'constant, cosine, stepped (x lr_decay_factor at lr_decay_points), '
          'exponential (x lr_decay_factor every lr_decay_epochs) or linear '
          '(straight down to 0 at the last step, FFCV\'s); all with warmup.')
  _define(values, flags.DEFINE_boolean, 'lr_per_epoch',
          'Hold the learning rate through each epoch at the schedule\'s '
          'value in the middle of the epoch; default: a new value each step.')
  _define(values, flags.DEFINE_float, 'end_learning_rate',
          'Where the polynomial and cosine decays end.')
  _define(values, flags.DEFINE_float, 'lars_decay_epochs',
          'Polynomial decay reaches end_learning_rate at this epoch (0: at '
          'the end of the run).')
  _define(values, flags.DEFINE_float, 'lars_epsilon',
          'Epsilon in the LARS trust-ratio denominator.')
  flags.DEFINE(_NumberListParser(), 'lr_decay_points', _D.lr_decay_points,
               'stepped: fractions of the run\'s steps where the learning '
               'rate is multiplied by lr_decay_factor, e.g. 0.3,0.6,0.8.',
               serializer=flags.CsvListSerializer(','), flag_values=values)
  _define(values, flags.DEFINE_float, 'lr_decay_epochs',
          'exponential: epochs (after warmup) per multiplication by '
          'lr_decay_factor.')
  _define(values, flags.DEFINE_float, 'lr_decay_factor',
          'stepped and exponential: the factor of each decay step.')
  _define(values, flags.DEFINE_float, 'momentum',
          'Momentum of SGD, LARS and RMSProp.')
  _define(values, flags.DEFINE_boolean, 'nesterov',
          'Nesterov momentum (SGD and LARS).')
  _define(values, flags.DEFINE_float, 'rmsprop_rho',
          'RMSProp: decay of the moving average of squared gradients.')
  _define(values, flags.DEFINE_float, 'rmsprop_epsilon',
          'RMSProp: stabilises the denominator sqrt(ms + eps) (tf_keras puts '
          'it outside the root when --momentum=0); tf_keras\'s default 1e-7 '
          'makes the first steps huge.')
  _define(values, flags.DEFINE_float, 'label_smoothing',
          'Label smoothing of the cross-entropy loss.')
  _define(values, flags.DEFINE_float, 'weight_decay',
          'Adds weight_decay * w to the gradient of every conv/dense kernel, '
          'on every path (regularisers, single L2 op, LARS).')
  _define(values, flags.DEFINE_boolean, 'single_l2_loss_op',
          'SGD/RMSProp: one L2 term over all kernels instead of per-layer '
          'regularisers (same gradient, fewer ops).')
  _define(values, flags.DEFINE_float, 'ema_decay',
          'Keep an exponential moving average of the weights with this '
          'decay (e.g. 0.999; 0: none): it is what evaluations score, '
          'validate reports and exports hold; the checkpoint keeps both.')
  _define(values, flags.DEFINE_boolean, 'ema_warmup',
          'Ramp the average\'s decay as min(ema_decay, (1 + step) / (10 + '
          'step)), so it forgets the random start quickly.')


def _define_output_flags(values: flags.FlagValues) -> None:
  """What a run writes to model_dir, and Weights & Biases."""
  _define(values, flags.DEFINE_string, 'model_dir',
          'Checkpoints, summaries, exports and run_summary.json.')
  _alias(values, 'md', 'model_dir')
  _define(values, flags.DEFINE_boolean, 'clean',
          'Remove model_dir before training.')
  _define(values, flags.DEFINE_boolean, 'enable_checkpoint_and_export',
          'Checkpoint every epoch and export a SavedModel to '
          'model_dir/saved_model at the end.')
  _define(values, flags.DEFINE_integer, 'checkpoint_interval_steps',
          'With --enable_checkpoint_and_export: also checkpoint every N '
          'steps; 0: at every epoch end only.')
  _define(values, flags.DEFINE_integer, 'max_checkpoints',
          'Checkpoints kept in model_dir (oldest deleted first).')
  _define(values, flags.DEFINE_boolean, 'enable_tensorboard',
          'Write TensorBoard summaries to model_dir/train and model_dir/eval.')
  flags.DEFINE_string(
      'profile_steps', _format_profile_steps(_D.profile_steps),
      '"start,stop": write a TensorBoard profile of these global steps to '
      'model_dir/profile.', flag_values=values)
  _define(values, flags.DEFINE_boolean, 'wandb',
          'Also log metrics.jsonl\'s records and the config to Weights & '
          'Biases (pip install wandb); offline, under model_dir/wandb, when '
          'not logged in or offline.')
  _define(values, flags.DEFINE_string, 'wandb_project',
          'W&B project of --wandb.')
  _define(values, flags.DEFINE_string, 'wandb_run_name',
          'W&B run name of --wandb; default: W&B picks one.')


def _define_distribution_flags(values: flags.FlagValues) -> None:
  """Devices, workers and threads."""
  _define(values, flags.DEFINE_string, 'distribution_strategy',
          'off, one_device, mirrored (GPUs of one host) or '
          'multi_worker_mirrored (several processes or hosts; TF_CONFIG, or '
          'derived from the MPI rank under mpirun).')
  _alias(values, 'ds', 'distribution_strategy')
  _define(values, flags.DEFINE_boolean, 'use_horovod',
          'Train with Horovod: one process per worker (started by mpirun, '
          'e.g. via demo_resnet_keras.py); --batch_size is per worker.')
  _define(values, flags.DEFINE_integer, 'num_gpus',
          'GPUs for mirrored/one_device; -1: every visible GPU.')
  _define(values, flags.DEFINE_integer, 'num_cpu_replicas',
          'With -ds mirrored on a machine without GPUs: split the CPU into '
          'this many logical devices, one replica each, to try multi-replica '
          'training (per-replica batches, cross-replica reductions, sync '
          'batch norm) without GPUs. No faster: the replicas share the cores '
          '(2-core AVX2 EPYC, ResNet-18 28x28 batch 128: 87 img/s with one '
          'replica, 86 with two).')
  _define(values, flags.DEFINE_integer, 'inter_op_parallelism_threads',
          'Threads running independent ops; 0: TensorFlow picks.')
  _define(values, flags.DEFINE_integer, 'intra_op_parallelism_threads',
          'Threads inside one op; 0: TensorFlow picks.')


class _NumberListParser(flags.ListParser):
  """Comma-separated numbers of one type, as a tuple (RunConfig holds no
  lists)."""

  def __init__(self, kind=float):
    super().__init__()
    self.kind = kind
    self.kind_name = 'integers' if kind is int else 'floats'

  def parse(self, argument):
    if isinstance(argument, (tuple, list)):
      return tuple(argument)
    try:
      return tuple(self.kind(p) for p in super().parse(argument))
    except ValueError:
      raise ValueError(f'expected comma-separated {self.kind_name}, got '
                       f'"{argument}"') from None

  def flag_type(self):
    return f'comma-separated {self.kind_name}'


RUN_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def apply_config(values: flags.FlagValues,
                 allowed: Collection[str] = RUN_CONFIG_KEYS,
                 launcher_keys: Collection[str] = ()) -> Dict[str, Any]:
  """Fills the flags --config's recipe sets and the command line does not;
  returns those settings. `values`: the entry point's parsed flags.
  """
  if not values.config:
    return {}
  path = recipes.resolve(values.config)
  return recipes.apply(values, recipes.load(path), f'--config={path}',
                       allowed, launcher_keys=launcher_keys)


def _format_profile_steps(steps: Optional[Tuple[int, int]]) -> Optional[str]:
  return steps and ','.join(map(str, steps))


def _parse_profile_steps(text):
  if not text:
    return None
  try:
    start, stop = (int(p) for p in text.split(','))
  except ValueError:
    raise UsageError(f'--profile_steps must be "start,stop" (two integers), '
                     f'got "{text}"') from None
  return start, stop


def config_from_flags(values: flags.FlagValues) -> RunConfig:
  """Builds (and validates) the RunConfig from parsed flags (`values`, as
  in apply_config)."""
  kwargs = {name: values[name].value for name in RUN_CONFIG_KEYS
            if name in values and name != 'profile_steps'}
  kwargs['profile_steps'] = _parse_profile_steps(values.profile_steps)
  if values.use_keras_mixed_precision:
    from absl import logging
    logging.info('--use_keras_mixed_precision: the Keras mixed-precision '
                 'policy is always used here; nothing to switch')
  cfg = RunConfig(**kwargs)
  cfg.validate()
  return cfg
