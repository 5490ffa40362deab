"""Optimizers, weight decay and gradient clipping.

For SGD, RMSProp and LARS, weight decay means one thing on every path: for a
decayed weight w it adds `weight_decay * w` to w's gradient (the
PyTorch/MLPerf convention, i.e. a loss term of weight_decay/2 * ||w||^2).
The paths that apply it (`weight_decay_path`):

  * per-layer L2 regularisers (SGD and RMSProp, the default):
    `l2(weight_decay / 2)`;
  * `--single_l2_loss_op` (SGD and RMSProp): one
    `weight_decay * sum(l2_loss(w))` term, where tf.nn.l2_loss already halves;
  * LARS: inside the optimizer, where it also enters the trust ratio;
  * AdamW and LAMB ('decoupled'): inside the optimizer, outside Adam's
    moments: the step adds `weight_decay * w` to Adam's update
    m_hat / (sqrt(v_hat) + eps), i.e. w -= lr * weight_decay * w
    (PyTorch's and timm's AdamW); LAMB then scales that sum by its trust
    ratio. Typical strengths are therefore 0.01-0.05, not 1e-4.

RMSProp then divides the whole gradient, decay term included, by its running
RMS (L2 regularisation, as in the RMSProp recipes; not decoupled decay).

Only convolution and dense kernels are decayed; batch-norm parameters and
biases are neither decayed nor layer-adapted, by LARS or LAMB (`is_decayed`).

`--clip_grad_norm` is the optimizers' own `global_clipnorm`: tf_keras applies
it inside `apply_gradients` after the cross-replica all-reduce, to gradients
the objective has already accumulated, all-reduced (Horovod) and unscaled
(fp16), and before the update; a LossScaleOptimizer hands its inner optimizer
aggregated gradients, which it still clips.
"""

import re

import tensorflow as tf
import tf_keras
from official.modeling.optimization import lamb as official_lamb
from official.modeling.optimization import lars as official_lars

from common.errors import UsageError
from resnet_keras.config import RunConfig

_KERNEL_NAME = re.compile(r'(^|/)kernel(:\d+)?$')


def is_decayed(variable_name: str) -> bool:
  """True for conv/dense kernels: the weights that get weight decay."""
  return _KERNEL_NAME.search(variable_name) is not None


def l2_regularizer(weight_decay: float):
  """The per-layer regulariser with the same gradient as the other paths."""
  if not weight_decay:
    return None
  return tf_keras.regularizers.l2(weight_decay / 2.0)


def single_l2_loss(variables, weight_decay: float) -> tf.Tensor:
  """One L2 term over all decayed variables (`--single_l2_loss_op`)."""
  decayed = [v for v in variables if is_decayed(v.name)]
  return weight_decay * tf.add_n(
      [tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in decayed])


def lars_trust_ratio(w_norm, g_norm, weight_decay: float, eeta: float,
                     epsilon: float):
  """Layer-wise LR factor of LARS (You et al., 2017; MLPerf form).

  eeta * ||w|| / (||g|| + weight_decay * ||w|| + epsilon), and 1 when either
  norm is zero (fresh zero-initialised layers must still move).
  """
  ratio = eeta * w_norm / (g_norm + weight_decay * w_norm + epsilon)
  return tf.where(tf.logical_and(w_norm > 0, g_norm > 0), ratio,
                  tf.ones_like(ratio))


class LARS(official_lars.LARS):
  """tf-models-official's LARS with the MLPerf trust ratio.

  The official update computes the trust ratio from the gradient *after* weight
  decay and has no epsilon; the reference recipes (LR 2.5-17, `--lars_epsilon`)
  were tuned with eeta*||w|| / (||g|| + wd*||w|| + eps), so that is what this
  applies. Which variables are decayed and adapted follows `is_decayed`.
  """

  def __init__(self, epsilon: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    self.lars_epsilon = epsilon

  def _use_weight_decay(self, param_name):
    return bool(self.weight_decay_rate) and is_decayed(param_name)

  def _do_layer_adaptation(self, param_name):
    return is_decayed(param_name)

  def _resource_apply_dense(self, grad, param, apply_state=None):
    var_device, var_dtype = param.device, param.dtype.base_dtype
    coefficients = ((apply_state or {}).get((var_device, var_dtype)) or
                    self._fallback_apply_state(var_device, var_dtype))
    learning_rate = coefficients['lr_t']
    v = self.get_slot(param, 'momentum')
    scaled_lr = learning_rate
    if self._do_layer_adaptation(param.name):
      scaled_lr = learning_rate * lars_trust_ratio(
          tf.norm(param), tf.norm(grad), self.weight_decay_rate, self.eeta,
          self.lars_epsilon)
    if self._use_weight_decay(param.name):
      grad += self.weight_decay_rate * param
    next_v = self.momentum * v + scaled_lr * grad
    update = self.momentum * next_v + scaled_lr * grad if self.nesterov else (
        next_v)
    return tf.group(param.assign_sub(update), v.assign(next_v))

  def get_config(self):
    config = super().get_config()
    config['epsilon'] = self.lars_epsilon
    return config


class AdamW(official_lamb.LAMB):
  """AdamW as PyTorch's and timm's, on tf-models-official's LAMB.

  The official LAMB's step is w -= lr * ratio * (m_hat / (sqrt(v_hat) + eps)
  + weight_decay * w), with PyTorch's bias correction and epsilon; without
  the trust ratio (ratio 1) that is PyTorch's AdamW, whose w *= 1 - lr *
  weight_decay before the Adam step is the same step, as Adam's update does
  not read w. (tf_keras's AdamW is of the new optimizer API, whose slots and
  loss scaling this package's legacy optimizers and checkpoints do not use;
  official's legacy AdamWeightDecay puts epsilon inside tf_keras Adam's bias
  correction and clips each replica's gradients before the all-reduce.)
  Which variables are decayed follows `is_decayed`, as timm's no-decay
  group does for biases and normalisation weights.
  """

  def __init__(self, name: str = 'AdamW', **kwargs):
    super().__init__(name=name, **kwargs)

  def _do_use_weight_decay(self, param_name):
    return is_decayed(param_name)

  def _do_layer_adaptation(self, param_name):
    del param_name  # No trust ratio.
    return False


class LAMB(AdamW):
  """tf-models-official's LAMB: AdamW's update per kernel times the trust
  ratio ||w|| / ||update|| (1 when either is 0), as timm's Lamb with
  trust_clip off.

  The official class names its exclusions by regex lists; here `is_decayed`
  decides both, as for LARS: conv/dense kernels get weight decay and the
  trust ratio, biases and normalisation weights neither (timm adapts only
  what it decays). One difference from timm: a kernel is adapted even at
  weight_decay 0 (the paper's LAMB), where timm's degenerates to Adam.
  timm's Lamb also clips the global gradient norm at 1.0 itself; here that
  is --clip_grad_norm's, for every optimizer.
  """

  def __init__(self, name: str = 'LAMB', **kwargs):
    super().__init__(name=name, **kwargs)

  def _do_layer_adaptation(self, param_name):
    return is_decayed(param_name)


def _sgd(cfg: RunConfig, learning_rate, **options):
  return tf_keras.optimizers.legacy.SGD(
      learning_rate=learning_rate, momentum=cfg.momentum,
      nesterov=cfg.nesterov, **options)


def _lars(cfg: RunConfig, learning_rate, **options):
  return LARS(learning_rate=learning_rate, momentum=cfg.momentum,
              weight_decay_rate=cfg.weight_decay, eeta=0.001,
              epsilon=cfg.lars_epsilon, nesterov=cfg.nesterov, **options)


def _rmsprop(cfg: RunConfig, learning_rate, **options):
  return tf_keras.optimizers.legacy.RMSprop(
      learning_rate=learning_rate, rho=cfg.rmsprop_rho,
      momentum=cfg.momentum, epsilon=cfg.rmsprop_epsilon, **options)


def _adam(adam):
  def build(cfg: RunConfig, learning_rate, **options):
    return adam(learning_rate=learning_rate, beta_1=cfg.adam_beta1,
                beta_2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
                weight_decay_rate=cfg.weight_decay, **options)
  return build


# Each of --optimizer's choices (config's OPTIMIZERS): how it is built,
# before loss scaling, and where its weight decay goes (L2: a loss term,
# `weight_decay_path` says which).
_BUILDS = {
    'SGD': (_sgd, 'l2'),
    'LARS': (_lars, 'lars'),
    'RMSProp': (_rmsprop, 'l2'),
    'AdamW': (_adam(AdamW), 'decoupled'),
    'LAMB': (_adam(LAMB), 'decoupled'),
}


def _build(cfg: RunConfig):
  """`cfg.optimizer`'s build and weight-decay path; a name declared without
  them ends the run in one line before anything is built, rather than
  training it as another optimizer."""
  if cfg.optimizer not in _BUILDS:
    raise UsageError(
        f'--optimizer={cfg.optimizer} is declared (OPTIMIZERS, '
        'resnet_keras/config/training_options.py) but never built: give it '
        'its build and weight-decay path in _BUILDS, '
        'resnet_keras/optimization/optimizers.py')
  return _BUILDS[cfg.optimizer]


def _base_optimizer(cfg: RunConfig, learning_rate, **options):
  """The optimizer the flags ask for, before loss scaling."""
  build, _ = _build(cfg)
  return build(cfg, learning_rate, **options)


def build_optimizer(cfg: RunConfig, learning_rate):
  """The optimizer the flags ask for, clipping the global gradient norm
  with --clip_grad_norm, wrapped for loss scaling under fp16."""
  options = ({'global_clipnorm': cfg.clip_grad_norm} if cfg.clip_grad_norm
             else {})
  optimizer = _base_optimizer(cfg, learning_rate, **options)
  if cfg.dtype == 'fp16':
    if cfg.loss_scale:
      optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
          optimizer, dynamic=False, initial_scale=cfg.loss_scale)
    else:
      optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
  return optimizer


def create_slots(optimizer, variables) -> None:
  """Creates the optimizer's slot variables now rather than at the first step.

  Then a checkpoint restores them at once (not deferred) and a multi-worker
  job can sync them from the chief before training starts. tf_keras's legacy
  optimizers (and their LossScaleOptimizer) expose this only privately.
  """
  optimizer._create_all_weights(variables)  # pylint: disable=protected-access


def weight_decay_path(cfg: RunConfig) -> str:
  """Which path applies weight decay in this run: 'none', 'lars',
  'decoupled' (AdamW, LAMB), 'single_l2_loss_op' or 'regularizers'."""
  _, path = _build(cfg)
  if not cfg.weight_decay:
    return 'none'
  if path != 'l2':
    return path
  # keras.applications backbones have no per-layer regularisers.
  if cfg.single_l2_loss_op or cfg.keras_applications_model:
    return 'single_l2_loss_op'
  return 'regularizers'
