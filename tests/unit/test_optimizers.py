"""LARS, Nesterov SGD, RMSProp, AdamW and LAMB against hand-computed steps
(and which variables AdamW and LAMB decay and adapt); the three
weight-decay paths of SGD agree; --clip_grad_norm against a hand-computed
global norm; AdamW's and LAMB's slots checkpoint and restore."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common import cli
from common.errors import UsageError
from resnet_keras.optimization import lr_schedules
from resnet_keras.model import network as network_lib
from resnet_keras.optimization import optimizers
from resnet_keras.config import RunConfig
from resnet_keras.config import training_options


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
  net = network_lib.resnet(18, 10, 32, weight_decay=wd)
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
  net = network_lib.build_network(cfg, 10, use_regularizers=True)
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
  assert type(optimizers.build_optimizer(RunConfig(optimizer='AdamW'),
                                         0.1)) is optimizers.AdamW
  assert type(optimizers.build_optimizer(RunConfig(optimizer='LAMB'),
                                         0.1)) is optimizers.LAMB
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
  for name in ('AdamW', 'LAMB'):
    assert optimizers.weight_decay_path(RunConfig(optimizer=name)) == (
        'decoupled')
    assert optimizers.weight_decay_path(RunConfig(
        optimizer=name, keras_applications_model='ResNet50')) == 'decoupled'
    assert optimizers.weight_decay_path(
        RunConfig(optimizer=name, weight_decay=0)) == 'none'


def test_every_optimizer_named_builds_one_of_its_own():
  built = {name: type(optimizers.build_optimizer(RunConfig(optimizer=name),
                                                 0.1))
           for name in training_options.OPTIMIZERS}
  assert len(set(built.values())) == len(training_options.OPTIMIZERS), built


def test_an_optimizer_named_but_not_built_fails_in_one_line(capsys):
  """A name added to OPTIMIZERS without its build trained as SGD without a
  word; now the plan's first look at it (its weight-decay path) ends the
  run in one line, and so would building it."""
  unbuilt = RunConfig(optimizer='Lion')
  for step in (optimizers.weight_decay_path,
               lambda cfg: optimizers.build_optimizer(cfg, 0.1)):
    with pytest.raises(UsageError, match=r'^--optimizer=Lion is declared '
                       r'\(OPTIMIZERS.*never built'):
      step(unbuilt)
  with pytest.raises(SystemExit) as stopped:
    cli.run_main(lambda argv: optimizers.weight_decay_path(unbuilt), [])
  assert stopped.value.code == UsageError.exit_code
  said = capsys.readouterr().err
  assert said.startswith('error: --optimizer=Lion') and said.count('\n') == 1


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


def _step(optimizer, pairs):
  optimizer.apply_gradients([(tf.constant(g, tf.float32), v)
                             for g, v in pairs])


def _adam_update(g, m, v, step, beta1=0.9, beta2=0.999, eps=1e-6):
  """PyTorch's Adam direction m_hat / (sqrt(v_hat) + eps), and the moments."""
  m = beta1 * m + (1 - beta1) * g
  v = beta2 * v + (1 - beta2) * g * g
  m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
  return m_hat / (np.sqrt(v_hat) + eps), m, v


def test_lamb_decays_and_adapts_the_kernel_only_by_hand():
  kernel = tf.Variable([3.0, 4.0], name='dense/kernel')
  gamma = tf.Variable([1.0, -1.0], name='stem_bn/gamma')
  opt = optimizers.build_optimizer(
      RunConfig(optimizer='LAMB', weight_decay=0.1, adam_epsilon=1e-6), 0.01)
  g_kernel, g_gamma = np.array([0.6, 0.8]), np.array([0.5, -0.5])
  _step(opt, [(g_kernel, kernel), (g_gamma, gamma)])
  # Step 1: m_hat = g, v_hat = g^2, so Adam's direction is g / (|g| + eps),
  # ~[1, 1]. Kernel: + 0.1 * w = ~[1.3, 1.4], norm ~1.9105; trust ratio
  # ||w|| / ||update|| = 5 / 1.9105 = ~2.6171; w -= 0.01 * 2.6171 * update.
  update = g_kernel / (g_kernel + 1e-6) + 0.1 * np.array([3.0, 4.0])
  assert np.linalg.norm(update) == pytest.approx(1.9105, abs=1e-4)
  np.testing.assert_allclose(kernel.numpy(), [3 - 0.034022, 4 - 0.036639],
                             atol=2e-6)
  # gamma: neither decay nor trust ratio: plain Adam, w -= 0.01 * sign(g).
  np.testing.assert_allclose(gamma.numpy(), [0.99, -0.99], atol=1e-7)

  # Step 2, bias-corrected moments, against the formulas.
  g2_kernel, g2_gamma = np.array([-0.2, 0.1]), np.array([0.05, 0.3])
  w1, gamma1 = kernel.numpy().astype(np.float64), gamma.numpy()
  _step(opt, [(g2_kernel, kernel), (g2_gamma, gamma)])
  direction, _, _ = _adam_update(g2_kernel, 0.1 * g_kernel,
                                 0.001 * g_kernel ** 2, 2)
  update = direction + 0.1 * w1
  ratio = np.linalg.norm(w1) / np.linalg.norm(update)
  np.testing.assert_allclose(kernel.numpy(), w1 - 0.01 * ratio * update,
                             rtol=1e-6)
  direction, _, _ = _adam_update(g2_gamma, 0.1 * g_gamma,
                                 0.001 * g_gamma ** 2, 2)
  np.testing.assert_allclose(gamma.numpy(), gamma1 - 0.01 * direction,
                             rtol=1e-6)


def test_adamw_decays_kernels_only_and_has_no_trust_ratio():
  kernel = tf.Variable([3.0, 4.0], name='dense/kernel')
  bias = tf.Variable([1.0, -1.0], name='dense/bias')
  gamma = tf.Variable([2.0], name='stem_bn/gamma')
  opt = optimizers.build_optimizer(
      RunConfig(optimizer='AdamW', weight_decay=0.5, adam_epsilon=1e-8), 0.1)
  _step(opt, [([0.6, 0.8], kernel), ([0.5, -0.5], bias), ([-3.0], gamma)])
  # PyTorch's AdamW: w *= 1 - lr * wd, then w -= lr * sign(g) on step 1.
  np.testing.assert_allclose(kernel.numpy(), [3 * 0.95 - 0.1, 4 * 0.95 - 0.1],
                             rtol=1e-6)
  np.testing.assert_allclose(bias.numpy(), [0.9, -0.9], rtol=1e-6)
  np.testing.assert_allclose(gamma.numpy(), [2.1], rtol=1e-6)


def test_adam_optimizers_scale_the_learning_rate_per_256_images():
  # "ResNet strikes back" A1/A2: LAMB at 5e-3 for batch 2048.
  for name in ('AdamW', 'LAMB'):
    cfg = RunConfig(optimizer=name, base_learning_rate=6.25e-4)
    assert lr_schedules.peak_learning_rate(cfg, 2048) == pytest.approx(5e-3)


@pytest.mark.parametrize('cfg', [
    RunConfig(momentum=0.0, clip_grad_norm=1.0),
    RunConfig(momentum=0.0, clip_grad_norm=1.0, dtype='fp16', loss_scale=128),
], ids=['fp32', 'fp16'])
def test_clip_grad_norm_clips_the_global_norm(cfg):
  """Gradients [3, 4] and [12]: global norm sqrt(9 + 16 + 144) = 13, so
  each is divided by 13 (SGD, lr 1: the step is the clipped gradient).
  Under fp16 the objective unscales before the optimizer, which clips."""
  kernel = tf.Variable([0.0, 0.0], name='dense/kernel')
  bias = tf.Variable([0.0], name='dense/bias')
  opt = optimizers.build_optimizer(cfg, 1.0)
  grads = [tf.constant([3.0, 4.0]), tf.constant([12.0])]
  if cfg.dtype == 'fp16':
    grads = opt.get_unscaled_gradients([g * 128 for g in grads])
  opt.apply_gradients(zip(grads, [kernel, bias]))
  np.testing.assert_allclose(kernel.numpy(), [-3 / 13, -4 / 13], rtol=1e-6)
  np.testing.assert_allclose(bias.numpy(), [-12 / 13], rtol=1e-6)
  # Within the bound: untouched.
  opt = optimizers.build_optimizer(RunConfig(momentum=0.0,
                                             clip_grad_norm=13.5), 1.0)
  opt.apply_gradients(zip([tf.constant([3.0, 4.0]), tf.constant([12.0])],
                          [kernel, bias]))
  np.testing.assert_allclose(bias.numpy(), [-12 / 13 - 12], rtol=1e-6)


def _dense_and_optimizer(cfg):
  model = tf_keras.Sequential([tf_keras.layers.Dense(3, name='fc')])
  model.build((None, 4))
  optimizer = optimizers.build_optimizer(cfg, 0.01)
  optimizers.create_slots(optimizer, model.trainable_variables)
  return model, optimizer


@pytest.mark.parametrize('cfg', [
    RunConfig(optimizer='AdamW', weight_decay=0.05),
    RunConfig(optimizer='LAMB', weight_decay=0.02, clip_grad_norm=1.0,
              dtype='fp16', loss_scale=128),
], ids=['AdamW', 'LAMB_fp16'])
def test_adam_slots_are_created_checkpointed_and_restored(cfg, tmp_path):
  model, optimizer = _dense_and_optimizer(cfg)
  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  slots = lambda opt, m: {(v.name, s): opt.get_slot(v, s).numpy()
                          for v in m.trainable_variables for s in ('m', 'v')}
  assert inner.get_slot_names() == ['m', 'v']
  assert not any(a.any() for a in slots(inner, model).values())  # before
  optimizer.apply_gradients(
      (tf.ones_like(v), v) for v in model.trainable_variables)
  saved = slots(inner, model)
  assert all(a.any() for a in saved.values())
  path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
      str(tmp_path / 'ckpt'))

  fresh_model, fresh = _dense_and_optimizer(cfg)
  tf.train.Checkpoint(model=fresh_model, optimizer=fresh).restore(
      path).assert_consumed()
  fresh_inner = getattr(fresh, 'inner_optimizer', fresh)
  assert int(fresh.iterations.numpy()) == 1
  restored = slots(fresh_inner, fresh_model)
  assert restored.keys() == saved.keys()
  for key in saved:
    np.testing.assert_array_equal(restored[key], saved[key], err_msg=str(key))
