"""Optimizers and weight decay.

Weight decay means one thing on every path: for a decayed weight w it adds
`weight_decay * w` to w's gradient (the PyTorch/MLPerf convention, i.e. a loss
term of weight_decay/2 * ||w||^2). The three paths that apply it:

  * per-layer L2 regularisers (SGD and RMSProp, the default):
    `l2(weight_decay / 2)`;
  * `--single_l2_loss_op` (SGD and RMSProp): one
    `weight_decay * sum(l2_loss(w))` term, where tf.nn.l2_loss already halves;
  * LARS: inside the optimizer, where it also enters the trust ratio.

RMSProp then divides the whole gradient, decay term included, by its running
RMS (L2 regularisation, as in the RMSProp recipes; not decoupled decay).

Only convolution and dense kernels are decayed; batch-norm parameters and
biases are neither decayed nor layer-adapted (`is_decayed`).
"""

import re

import tensorflow as tf
import tf_keras
from official.modeling.optimization import lars as official_lars

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


def build_optimizer(cfg: RunConfig, learning_rate):
  """The optimizer the flags ask for, wrapped for loss scaling under fp16."""
  if cfg.uses_lars:
    optimizer = LARS(learning_rate=learning_rate, momentum=cfg.momentum,
                     weight_decay_rate=cfg.weight_decay, eeta=0.001,
                     epsilon=cfg.lars_epsilon, nesterov=cfg.nesterov)
  elif cfg.optimizer == 'RMSProp':
    optimizer = tf_keras.optimizers.legacy.RMSprop(
        learning_rate=learning_rate, rho=cfg.rmsprop_rho,
        momentum=cfg.momentum, epsilon=cfg.rmsprop_epsilon)
  else:
    optimizer = tf_keras.optimizers.legacy.SGD(
        learning_rate=learning_rate, momentum=cfg.momentum,
        nesterov=cfg.nesterov)
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
  """Which of the three equivalent paths applies weight decay in this run."""
  if not cfg.weight_decay:
    return 'none'
  if cfg.uses_lars:
    return 'lars'
  # keras.applications backbones have no per-layer regularisers.
  if cfg.single_l2_loss_op or cfg.keras_applications_model:
    return 'single_l2_loss_op'
  return 'regularizers'
