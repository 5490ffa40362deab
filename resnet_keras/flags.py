"""Command-line flags of resnet_ctl_imagenet_main.py, defined once.

Grouped in the order the data flows (data, model, precision, training,
optimizer, outputs, runtime). Short aliases follow the reference README
(-dd, -md, -te, -ebe, -bs, -dt, -dlit, -synth, -ds). `config_from_flags`
is the only place that reads FLAGS; everything else takes a RunConfig.
"""

import dataclasses
from typing import Any, Collection, Dict

from absl import flags

from resnet_keras import recipes
from resnet_keras.config import RunConfig
from common.errors import UsageError

_D = RunConfig()  # Defaults live in one place: the dataclass.


def _alias(short, name):
  flags.DEFINE_alias(short, name)


def define_flags() -> None:
  """Defines every flag; safe to call once per process."""
  # Recipes.
  flags.DEFINE_string('config', None,
                      'A recipe: NAME of configs/NAME.yaml (e.g. '
                      'resnet50_lars_1worker) or a YAML file of flag: value '
                      'lines. Flags given on the command line override it.')
  flags.DEFINE_boolean('print_config', False,
                       'Print the effective configuration (flags, recipe and '
                       'defaults merged) as YAML and exit.')
  # Data.
  flags.DEFINE_string('data_dir', _D.data_dir,
                      'Directory with the TFRecord shards.')
  _alias('dd', 'data_dir')
  flags.DEFINE_string('dataset', _D.dataset,
                      'imagenet (any ImageNet-format TFRecords), cifar10 or '
                      'cifar100 (the standard binary files in --data_dir).')
  flags.DEFINE_boolean('use_synthetic_data', False,
                       'Train on random images held in memory (no files).')
  _alias('synth', 'use_synthetic_data')
  flags.DEFINE_integer('image_size', _D.image_size,
                       'Height and width of the model input (>= 32 with the '
                       'imagenet stem, 16 small, 8 cifar).')
  flags.DEFINE_string('data_loader_image_type', _D.data_loader_image_type,
                      'dtype images leave the input pipeline in: fp32, bf16, '
                      'or uint8 (cast and mean subtraction run on the device).')
  _alias('dlit', 'data_loader_image_type')
  flags.DEFINE_boolean('experimental_preloading', _D.experimental_preloading,
                       'Prefetch batches to the accelerator '
                       '(prefetch_to_device); a no-op on CPU.')
  flags.DEFINE_integer('num_classes', 0,
                       'Output units; 0: from the dataset (synthetic: 1000).')
  flags.DEFINE_integer('num_train_examples', 0,
                       'Use only the first N training examples; 0: all '
                       '(synthetic: ImageNet\'s 1,281,167).')
  flags.DEFINE_integer('num_eval_examples', 0,
                       'Use only the first N validation examples; 0: all '
                       '(synthetic: ImageNet\'s 50,000).')
  flags.DEFINE_float('train_crop_min_area', _D.train_crop_min_area,
                     'Smallest fraction of an image a random training crop '
                     'covers (0.05: ImageNet; larger for small images).')
  flags.DEFINE_float('eval_crop_fraction', _D.eval_crop_fraction,
                     'Evaluation keeps this central fraction of the short '
                     'side (0.875 = 224/256, ImageNet\'s standard; 1.0 for '
                     'small images centred in their frame).')
  flags.DEFINE_boolean('skip_corrupt_records', False,
                       'Skip unreadable TFRecord records and undecodable '
                       'images (counted and reported at the end) instead of '
                       'stopping with an error that names the file.')
  flags.DEFINE_boolean('training_dataset_cache', False,
                       'Cache the training records in memory after the first '
                       'epoch (for datasets that fit in RAM).')
  flags.DEFINE_integer('datasets_num_private_threads', 0,
                       'Threads of a private tf.data pool for the input '
                       'pipeline; 0: tf.data\'s shared pool.')
  # Model.
  flags.DEFINE_integer('resnet_depth', _D.resnet_depth,
                       'ResNet v1.5 depth: 10, 18, 34, 50, 101 or 152 (10: '
                       'one basic block per stage).')
  flags.DEFINE_string('stem', _D.stem,
                      'First layers before the residual stages: imagenet '
                      '(7x7/2 conv + 3x3/2 max pool), small (3x3/1 conv + '
                      'max pool: for 28-64 px images, 4x the compute at the '
                      'same size) or cifar (3x3/1 conv, no pool: 16x).')
  flags.DEFINE_string('keras_applications_model', None,
                      'Use a keras.applications backbone instead: ResNet50, '
                      'ResNet101, ResNet152, ResNet50V2, ResNet101V2, '
                      'ResNet152V2.')
  flags.DEFINE_float('width_multiplier', _D.width_multiplier,
                     'Channels of every layer x this, rounded to multiples '
                     'of 8 (Wide-ResNet\'s k; below 1 for a cheaper model): '
                     '0.25 trains ResNet-18 on 28x28 images several times '
                     'faster on CPUs (configs/fashion_mnist_resnet18_w025'
                     '.yaml). 1: the standard ResNet.')
  flags.DEFINE_string('conv_impl', _D.conv_impl,
                      'How convolutions run: native (oneDNN/cuDNN), matmul '
                      '(1x1 convolutions as one matmul, and kernel gradients '
                      'of 3x3 convolutions on maps <= 7x7 with >= 256 '
                      'channels as patches x matmul: much faster in bf16 on '
                      'CPUs with AMX), or auto (matmul for bf16 on CPUs, and '
                      'for fp32 on CPUs without AVX-512). '
                      'Same weights and results either way.')
  flags.DEFINE_string('relu_impl', _D.relu_impl,
                      'How the ReLU after each residual add runs in '
                      'training: native (tf.nn.relu), xla (the add and the '
                      'ReLU as one XLA-compiled kernel, same results: ~7% '
                      'faster ResNet-50 training in bf16 on CPUs), bitwise (an '
                      'integer max on the floats\' bits, no XLA; same '
                      'results except that a negative NaN becomes 0), or '
                      'auto (xla for bf16 on CPUs). Evaluation and export '
                      'always run tf.nn.relu.')
  flags.DEFINE_string('norm', _D.norm,
                      'Normalisation after each convolution: batch, or group '
                      '(GroupNormalization: independent of the batch, for '
                      'small per-replica batches; no moving statistics).')
  flags.DEFINE_integer('groups', _D.groups,
                       '--norm=group: channel groups per layer; must divide '
                       '64 (every channel count of the ResNets).')
  flags.DEFINE_boolean('sync_batch_norm', False,
                       'Batch statistics over the global batch (all-reduced '
                       'across tf.distribute replicas, or Horovod workers) '
                       'instead of each replica\'s own batch.')
  flags.DEFINE_boolean('enable_recompute', False,
                       'Keep only each residual stage\'s input during the '
                       'forward pass and recompute its activations in the '
                       'backward pass (tf.recompute_grad): less memory for '
                       'about one more forward pass of compute.')
  # Precision.
  flags.DEFINE_string('dtype', _D.dtype,
                      'Compute precision: fp32, bf16 (mixed_bfloat16; fast on '
                      'CPUs with AMX-BF16/AVX512_BF16 and on GPUs of compute '
                      'capability >= 8.0, emulated and slower than fp32 on '
                      'other CPUs), fp16 (mixed_float16 with loss scaling; '
                      'GPU only in practice), or auto (bf16 where it is fast, '
                      'fp16 on older GPUs, fp32 elsewhere; the choice and why '
                      'are logged and recorded in config.json).')
  _alias('dt', 'dtype')
  flags.DEFINE_float('loss_scale', 0.0,
                     'fp16: a fixed loss scale; 0: dynamic loss scaling.')
  flags.DEFINE_boolean('use_keras_mixed_precision', False,
                       'Accepted for compatibility: the Keras mixed-precision '
                       'policy is the only bf16/fp16 path here.')
  flags.DEFINE_boolean('enable_xla', False,
                       'Compile with XLA (auto-clustering). For GPUs; on CPUs '
                       'it is slower than the default oneDNN kernels.')
  # Training cadence.
  flags.DEFINE_integer('batch_size', _D.batch_size,
                       'Global batch size (tf.distribute); per worker with '
                       'Horovod.')
  _alias('bs', 'batch_size')
  flags.DEFINE_integer('train_epochs', _D.train_epochs,
                       'Number of training epochs.')
  _alias('te', 'train_epochs')
  flags.DEFINE_integer('train_steps', 0,
                       'Cap on steps per epoch; 0: the whole training set.')
  flags.DEFINE_integer('steps_per_loop', _D.steps_per_loop,
                       'Steps run on the device per host call (one '
                       'tf.function); capped at steps per epoch.')
  flags.DEFINE_integer('num_accumulation_steps', _D.num_accumulation_steps,
                       'Split each step\'s batch into this many micro-batches '
                       'and sum their gradients (float32) before one '
                       'optimizer update: --batch_size stays the batch per '
                       'update (for the LR, schedule and logs) while memory '
                       'holds one micro-batch.')
  flags.DEFINE_integer('log_steps', _D.log_steps,
                       'Print a status line every N steps.')
  flags.DEFINE_integer('epochs_between_evals', _D.epochs_between_evals,
                       'Evaluate every N epochs (and at the end).')
  _alias('ebe', 'epochs_between_evals')
  flags.DEFINE_integer('eval_offset_epochs', _D.eval_offset_epochs,
                       'Epoch of the first evaluation, then every '
                       '--epochs_between_evals (MLPerf style: e.g. 3 with 4 '
                       'evaluates after epochs 3, 7, 11, ...); 0: first at '
                       '--epochs_between_evals. The end is always evaluated.')
  flags.DEFINE_boolean('skip_eval', False, 'Do not evaluate.')
  flags.DEFINE_float('target_accuracy', 0.0,
                     'Stop once eval top-1 accuracy reaches this fraction; '
                     '0: never stop early.')
  flags.DEFINE_integer('global_seed', None,
                       'Seed for weights, data order and augmentation '
                       '(deterministic input order; TensorFlow\'s op '
                       'determinism stays off): on CPUs two runs with the same '
                       'flags log the same losses step by step, and a resumed '
                       'run continues exactly.')
  flags.DEFINE_boolean('use_tf_function', _D.use_tf_function,
                       'Compile steps with tf.function (off: eager, for '
                       'debugging).')
  flags.DEFINE_boolean('use_tf_while_loop', _D.use_tf_while_loop,
                       'Run the steps of a loop inside one tf.function '
                       '(tf.range); off: one host call per step.')
  # Optimizer and schedule.
  flags.DEFINE_string('optimizer', _D.optimizer,
                      'SGD (momentum), LARS or RMSProp.')
  flags.DEFINE_float('base_learning_rate', _D.base_learning_rate,
                     'SGD and RMSProp: learning rate per 256 images (scaled '
                     'by global batch / 256); LARS: the peak learning rate '
                     'as is.')
  flags.DEFINE_float('warmup_epochs', _D.warmup_epochs,
                     'Epochs of linear warmup from 0 to the peak.')
  flags.DEFINE_string('lr_schedule', _D.lr_schedule,
                      'piecewise (x0.1 at epochs 30/60/80), polynomial (power '
                      '2), constant, cosine, stepped (x lr_decay_factor at '
                      'lr_decay_points) or exponential (x lr_decay_factor '
                      'every lr_decay_epochs); all with warmup.')
  flags.DEFINE_float('end_learning_rate', _D.end_learning_rate,
                     'Where the polynomial and cosine decays end.')
  flags.DEFINE_float('lars_decay_epochs', 0.0,
                     'Polynomial decay reaches end_learning_rate at this epoch '
                     '(0: at the end of the run).')
  flags.DEFINE_float('lars_epsilon', _D.lars_epsilon,
                     'Epsilon in the LARS trust-ratio denominator.')
  flags.DEFINE(_FloatListParser(), 'lr_decay_points', _D.lr_decay_points,
               'stepped: fractions of the run\'s steps where the learning '
               'rate is multiplied by lr_decay_factor, e.g. 0.3,0.6,0.8.',
               serializer=flags.CsvListSerializer(','))
  flags.DEFINE_float('lr_decay_epochs', _D.lr_decay_epochs,
                     'exponential: epochs (after warmup) per multiplication '
                     'by lr_decay_factor.')
  flags.DEFINE_float('lr_decay_factor', _D.lr_decay_factor,
                     'stepped and exponential: the factor of each decay step.')
  flags.DEFINE_float('momentum', _D.momentum,
                     'Momentum of SGD, LARS and RMSProp.')
  flags.DEFINE_boolean('nesterov', False,
                       'Nesterov momentum (SGD and LARS).')
  flags.DEFINE_float('rmsprop_rho', _D.rmsprop_rho,
                     'RMSProp: decay of the moving average of squared '
                     'gradients.')
  flags.DEFINE_float('rmsprop_epsilon', _D.rmsprop_epsilon,
                     'RMSProp: stabilises the denominator sqrt(ms + eps) '
                     '(tf_keras puts it outside the root when --momentum=0); '
                     'tf_keras\'s default 1e-7 makes the first steps huge.')
  flags.DEFINE_float('label_smoothing', 0.0,
                     'Label smoothing of the cross-entropy loss.')
  flags.DEFINE_float('weight_decay', _D.weight_decay,
                     'Adds weight_decay * w to the gradient of every conv/dense '
                     'kernel, on every path (regularisers, single L2 op, LARS).')
  flags.DEFINE_boolean('single_l2_loss_op', False,
                       'SGD/RMSProp: one L2 term over all kernels instead of '
                       'per-layer regularisers (same gradient, fewer ops).')
  # Outputs.
  flags.DEFINE_string('model_dir', _D.model_dir,
                      'Checkpoints, summaries, exports and run_summary.json.')
  _alias('md', 'model_dir')
  flags.DEFINE_boolean('clean', False, 'Remove model_dir before training.')
  flags.DEFINE_boolean('enable_checkpoint_and_export', False,
                       'Checkpoint every epoch and export a SavedModel to '
                       'model_dir/saved_model at the end.')
  flags.DEFINE_integer('checkpoint_interval_steps', 0,
                       'With --enable_checkpoint_and_export: also checkpoint '
                       'every N steps; 0: at every epoch end only.')
  flags.DEFINE_integer('max_checkpoints', _D.max_checkpoints,
                       'Checkpoints kept in model_dir (oldest deleted first).')
  flags.DEFINE_boolean('enable_tensorboard', False,
                       'Write TensorBoard summaries to model_dir/train and '
                       'model_dir/eval.')
  flags.DEFINE_string('profile_steps', None,
                      '"start,stop": write a TensorBoard profile of these '
                      'global steps to model_dir/profile.')
  # Runtime.
  flags.DEFINE_string('distribution_strategy', _D.distribution_strategy,
                      'off, one_device, mirrored (GPUs of one host) or '
                      'multi_worker_mirrored (several processes or hosts; '
                      'TF_CONFIG, or derived from the MPI rank under mpirun).')
  _alias('ds', 'distribution_strategy')
  flags.DEFINE_boolean('use_horovod', False,
                       'Train with Horovod: one process per worker (started '
                       'by mpirun, e.g. via demo_resnet_keras.py); '
                       '--batch_size is per worker.')
  flags.DEFINE_integer('num_gpus', -1,
                       'GPUs for mirrored/one_device; -1: every visible GPU.')
  flags.DEFINE_integer('num_cpu_replicas', _D.num_cpu_replicas,
                       'With -ds mirrored on a machine without GPUs: split '
                       'the CPU into this many logical devices, one replica '
                       'each, to try multi-replica training (per-replica '
                       'batches, cross-replica reductions, sync batch norm) '
                       'without GPUs. No faster: the replicas share the '
                       'cores (2-core AVX2 EPYC, ResNet-18 28x28 batch 128: '
                       '87 img/s with one replica, 86 with two).')
  flags.DEFINE_integer('inter_op_parallelism_threads', 0,
                       'Threads running independent ops; 0: TensorFlow picks.')
  flags.DEFINE_integer('intra_op_parallelism_threads', 0,
                       'Threads inside one op; 0: TensorFlow picks.')
  _define_warm_start_and_tracking_flags()


def _define_warm_start_and_tracking_flags() -> None:
  """Starting from another run's weights, and Weights & Biases."""
  flags.DEFINE_string('restore_from', None,
                      'Start a new run from another run\'s checkpoint (a '
                      'checkpoint prefix such as DIR/ckpt-8, or a model_dir: '
                      'its latest) of the same model; only while --model_dir '
                      'has no checkpoint of its own (then it resumes).')
  flags.DEFINE_boolean('restore_optimizer', False,
                       'With --restore_from: also restore the optimizer '
                       '(momentum slots, step, loss scale), so training goes '
                       'on from that step; default: weights only, step 0.')
  flags.DEFINE_string('pretrained_checkpoint', None,
                      'Transfer learning: load every layer but the '
                      'classification head from another run\'s checkpoint '
                      '(prefix or model_dir) of the same architecture; the '
                      'head is new, for this data\'s classes.')
  flags.DEFINE_boolean('freeze_backbone', False,
                       'With --pretrained_checkpoint: train only the head; the '
                       'backbone\'s batch norm keeps its pretrained statistics '
                       '(inference mode).')
  flags.DEFINE_boolean('wandb', False,
                       'Also log metrics.jsonl\'s records and the config to '
                       'Weights & Biases (pip install wandb); offline, under '
                       'model_dir/wandb, when not logged in or offline.')
  flags.DEFINE_string('wandb_project', _D.wandb_project,
                      'W&B project of --wandb.')
  flags.DEFINE_string('wandb_run_name', None,
                      'W&B run name of --wandb; default: W&B picks one.')


class _FloatListParser(flags.ListParser):
  """Comma-separated floats, as a tuple (RunConfig holds no lists)."""

  def parse(self, argument):
    if isinstance(argument, (tuple, list)):
      return tuple(argument)
    try:
      return tuple(float(p) for p in super().parse(argument))
    except ValueError:
      raise ValueError(f'expected comma-separated numbers, got "{argument}"'
                       ) from None

  def flag_type(self):
    return 'comma-separated floats'


RUN_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def apply_config(values=None, allowed: Collection[str] = RUN_CONFIG_KEYS,
                 launcher_keys: Collection[str] = ()) -> Dict[str, Any]:
  """Fills the flags --config's recipe sets and the command line does not;
  returns those settings."""
  values = values or flags.FLAGS
  if not values.config:
    return {}
  path = recipes.resolve(values.config)
  return recipes.apply(values, recipes.load(path), f'--config={path}',
                       allowed, launcher_keys=launcher_keys)


def _parse_profile_steps(text):
  if not text:
    return None
  try:
    start, stop = (int(p) for p in text.split(','))
  except ValueError:
    raise UsageError(f'--profile_steps must be "start,stop" (two integers), '
                     f'got "{text}"') from None
  return start, stop


def config_from_flags(values=None) -> RunConfig:
  """Builds (and validates) the RunConfig from parsed flags."""
  values = values or flags.FLAGS
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
