"""LARS, Nesterov SGD and RMSProp against hand-computed steps; the three
weight-decay paths agree."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras import models
from resnet_keras import optimizers
from resnet_keras.config import RunConfig


def test_is_decayed_matches_kernels_only():
  assert optimizers.is_decayed('stage1_block1_conv1/kernel:0')
  assert optimizers.is_decayed('fc/kernel:0')
  assert optimizers.is_decayed('kernel')
  for name in ('fc/bias:0', 'stem_bn/gamma:0', 'stem_bn/beta:0',
               'stem_bn/moving_mean:0', 'my_kernel_scale:0'):
    assert not optimizers.is_decayed(name)


def test_trust_ratio_formula_and_zero_norms():
  r = optimizers.lars_trust_ratio(tf.constant(5.0), tf.constant(1.0), 0.1,
                                  0.001, 0.5)
  assert float(r) == pytest.approx(0.001 * 5 / (1 + 0.5 + 0.5))
  assert float(optimizers.lars_trust_ratio(tf.constant(0.0), tf.constant(1.0),
                                           0.1, 0.001, 0.0)) == 1.0
  assert float(optimizers.lars_trust_ratio(tf.constant(2.0), tf.constant(0.0),
                                           0.1, 0.001, 0.0)) == 1.0


def test_lars_two_steps_by_hand():
  kernel = tf.Variable([3.0, 4.0], name='dense/kernel')
  bias = tf.Variable([1.0, -1.0], name='dense/bias')
  opt = optimizers.LARS(learning_rate=2.0, momentum=0.9, weight_decay_rate=0.1,
                        eeta=0.001, epsilon=0.5)
  g_kernel = tf.constant([0.6, 0.8])   # norm 1
  g_bias = tf.constant([0.5, 0.5])
  opt.apply_gradients([(g_kernel, kernel), (g_bias, bias)])
  # Kernel: trust = 0.001*5 / (1 + 0.1*5 + 0.5) = 0.0025 -> scaled lr 0.005;
  # decayed grad = g + 0.1*w = [0.9, 1.2]; v = 0.005*[0.9, 1.2].
  np.testing.assert_allclose(kernel.numpy(), [3 - 0.0045, 4 - 0.006],
                             rtol=1e-6)
  # Bias: excluded from decay and adaptation: plain momentum SGD, v = 2*g.
  np.testing.assert_allclose(bias.numpy(), [0.0, -2.0], rtol=1e-6)
  opt.apply_gradients([(g_kernel, kernel), (g_bias, bias)])
  w1 = np.array([2.9955, 3.994])
  trust = 0.001 * np.linalg.norm(w1) / (1 + 0.1 * np.linalg.norm(w1) + 0.5)
  v2 = 0.9 * np.array([0.0045, 0.006]) + 2.0 * trust * (
      np.array([0.6, 0.8]) + 0.1 * w1)
  np.testing.assert_allclose(kernel.numpy(), w1 - v2, rtol=1e-5)
  np.testing.assert_allclose(bias.numpy(), [0.0 - 1.9, -2.0 - 1.9], rtol=1e-6)


def test_three_weight_decay_paths_give_the_same_gradient():
  wd = 3e-3
  net = models.resnet(18, 10, 32, weight_decay=wd)
  variables = net.trainable_variables
  with tf.GradientTape(persistent=True) as tape:
    reg_loss = tf.add_n(net.losses)
    single = optimizers.single_l2_loss(variables, wd)
  reg_grads = tape.gradient(reg_loss, variables)
  single_grads = tape.gradient(single, variables)
  before = [v.numpy() for v in variables]
  # LARS with a zero data gradient, lr 1, no momentum: the step is the decay.
  lars = optimizers.LARS(learning_rate=1.0, momentum=0.0,
                         weight_decay_rate=wd)
  lars.apply_gradients([(tf.zeros_like(v), v) for v in variables])
  num_kernels = 0
  for v, w, g_reg, g_single in zip(variables, before, reg_grads, single_grads):
    lars_step = w - v.numpy()
    if optimizers.is_decayed(v.name):
      num_kernels += 1
      np.testing.assert_allclose(g_reg.numpy(), wd * w, rtol=1e-5, atol=1e-9)
      np.testing.assert_allclose(g_single.numpy(), wd * w, rtol=1e-5,
                                 atol=1e-9)
      np.testing.assert_allclose(lars_step, wd * w, rtol=1e-4, atol=1e-9)
    else:
      assert g_reg is None and g_single is None
      np.testing.assert_array_equal(lars_step, 0.0)
  assert num_kernels == 21  # 20 convs (incl. 3 projections) + fc


@pytest.mark.parametrize('cfg', [
    RunConfig(resnet_depth=10, image_size=32),
    RunConfig(resnet_depth=10, image_size=32, norm='group', groups=8),
    RunConfig(keras_applications_model='ResNet50', image_size=32),
], ids=['batch_norm', 'group_norm', 'keras_applications'])
def test_weight_decay_reaches_only_conv_and_dense_kernels(cfg):
  """On every model the trainer builds, the decayed variables of all three
  paths (is_decayed: the single L2 term and LARS) are exactly the conv and
  dense kernels: no norm scale or offset, no bias (keras.applications'
  convolutions have biases); the per-layer regularisers sit on the same
  kernels."""
  tf_keras.mixed_precision.set_global_policy('float32')
  net = models.build_network(cfg, 10, use_regularizers=True)
  kernels = {id(layer.kernel) for layer in net.layers
             if isinstance(layer, (tf_keras.layers.Conv2D,
                                   tf_keras.layers.Dense))}
  decayed = {id(v) for v in net.trainable_variables
             if optimizers.is_decayed(v.name)}
  assert decayed == kernels
  undecayed = [v.name for v in net.trainable_variables
               if not optimizers.is_decayed(v.name)]
  assert undecayed and all(
      n.rsplit('/', 1)[-1].split(':')[0] in ('gamma', 'beta', 'bias')
      for n in undecayed), undecayed
  # keras.applications have no regularisers: their decay is the L2 term.
  assert len(net.losses) == (0 if cfg.keras_applications_model
                             else len(kernels))


def test_build_optimizer_kinds():
  assert isinstance(optimizers.build_optimizer(RunConfig(), 0.1),
                    tf_keras.optimizers.legacy.SGD)
  assert isinstance(optimizers.build_optimizer(RunConfig(optimizer='LARS'),
                                               0.1), optimizers.LARS)
  fp16 = optimizers.build_optimizer(RunConfig(dtype='fp16'), 0.1)
  assert fp16.dynamic
  fixed = optimizers.build_optimizer(RunConfig(dtype='fp16', loss_scale=128),
                                     0.1)
  assert not fixed.dynamic and float(fixed.loss_scale) == 128.0


def test_weight_decay_path_selection():
  assert optimizers.weight_decay_path(RunConfig()) == 'regularizers'
  assert optimizers.weight_decay_path(
      RunConfig(single_l2_loss_op=True)) == 'single_l2_loss_op'
  assert optimizers.weight_decay_path(
      RunConfig(optimizer='LARS', single_l2_loss_op=True)) == 'lars'
  assert optimizers.weight_decay_path(RunConfig(weight_decay=0)) == 'none'
  assert optimizers.weight_decay_path(
      RunConfig(keras_applications_model='ResNet50')) == 'single_l2_loss_op'


def _two_steps(optimizer, w0, grads):
  w = tf.Variable(w0, name='dense/kernel')
  for g in grads:
    optimizer.apply_gradients([(tf.constant(g, tf.float32), w)])
  return w.numpy()


def test_sgd_nesterov_two_steps_by_hand():
  cfg = RunConfig(momentum=0.9, nesterov=True)
  w = _two_steps(optimizers.build_optimizer(cfg, 0.5), [1.0, -2.0],
                 [[0.2, 0.4], [0.1, -0.3]])
  # tf_keras: v = m*v - lr*g; w += m*v - lr*g.
  v1 = -0.5 * np.array([0.2, 0.4])
  w1 = np.array([1.0, -2.0]) + 0.9 * v1 - 0.5 * np.array([0.2, 0.4])
  v2 = 0.9 * v1 - 0.5 * np.array([0.1, -0.3])
  w2 = w1 + 0.9 * v2 - 0.5 * np.array([0.1, -0.3])
  np.testing.assert_allclose(w, w2, rtol=1e-6)
  plain = _two_steps(optimizers.build_optimizer(RunConfig(momentum=0.9), 0.5),
                     [1.0, -2.0], [[0.2, 0.4], [0.1, -0.3]])
  np.testing.assert_allclose(plain, np.array([1.0, -2.0]) + v1 + v2,
                             rtol=1e-6)


def test_lars_nesterov_step_by_hand():
  opt = optimizers.build_optimizer(
      RunConfig(optimizer='LARS', momentum=0.9, nesterov=True,
                weight_decay=0.0), 2.0)
  w = _two_steps(opt, [3.0, 4.0], [[0.6, 0.8]])
  # Trust ratio 0.001 * 5 / 1; v = lr' g; update = m*v + lr' g.
  scaled = 2.0 * 0.005 * np.array([0.6, 0.8])
  np.testing.assert_allclose(w, np.array([3.0, 4.0]) - 1.9 * scaled,
                             rtol=1e-6)


def test_rmsprop_two_steps_by_hand():
  cfg = RunConfig(optimizer='RMSProp', momentum=0.9, rmsprop_rho=0.8,
                  rmsprop_epsilon=1e-3)
  opt = optimizers.build_optimizer(cfg, 0.1)
  assert isinstance(opt, tf_keras.optimizers.legacy.RMSprop)
  grads = [np.array([0.5, -0.02]), np.array([0.1, 0.3])]
  w = _two_steps(opt, [1.0, 2.0], grads)
  # ms = rho*ms + (1-rho) g^2; mom = m*mom + lr g / sqrt(ms + eps); w -= mom.
  ms, mom, expected = np.zeros(2), np.zeros(2), np.array([1.0, 2.0])
  for g in grads:
    ms = 0.8 * ms + 0.2 * g ** 2
    mom = 0.9 * mom + 0.1 * g / np.sqrt(ms + 1e-3)
    expected -= mom
  np.testing.assert_allclose(w, expected, rtol=1e-5)


def test_rmsprop_keeps_the_weight_decay_path_of_sgd():
  assert optimizers.weight_decay_path(
      RunConfig(optimizer='RMSProp')) == 'regularizers'
  assert optimizers.weight_decay_path(
      RunConfig(optimizer='RMSProp', single_l2_loss_op=True)) == (
          'single_l2_loss_op')
  fp16 = optimizers.build_optimizer(RunConfig(optimizer='RMSProp',
                                              dtype='fp16'), 0.1)
  assert isinstance(fp16.inner_optimizer, tf_keras.optimizers.legacy.RMSprop)
