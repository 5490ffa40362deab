"""The training's option groups: how long it runs and when it logs,
evaluates and stops (LoopConfig), the optimizer and the weight average
(OptimizerConfig), the learning rate (ScheduleConfig) and the loss
(LossConfig); each with its choices and its own checks."""

import dataclasses
from typing import Optional, Tuple

from common.errors import UsageError
from resnet_keras.config.options import check_fields, one_of, option


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


LR_SCHEDULES = ('piecewise', 'polynomial', 'constant', 'cosine', 'stepped',
                'exponential', 'linear')


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


# The per-example loss of a training step (objective.py).
LOSSES = ('softmax', 'bce')


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


OPTIMIZERS = ('SGD', 'LARS', 'RMSProp', 'AdamW', 'LAMB')
# What --optimizer's help says of each, beside its name.
_OPTIMIZER_WORDS = {
    'SGD': 'momentum',
    'AdamW': "decoupled weight decay, as PyTorch's and timm's",
    'LAMB': "AdamW's update scaled per kernel by ||w|| / ||update||, as "
            'timm\'s, which "ResNet strikes back" trains with'}
# Adam's moments and decoupled weight decay, inside the optimizer.
ADAM_OPTIMIZERS = ('AdamW', 'LAMB')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer and the average of the weights."""
  optimizer: str = option(
      'SGD',
      one_of(OPTIMIZERS, _OPTIMIZER_WORDS) + '. LARS and LAMB adapt '
      'conv/dense kernels only; '
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
