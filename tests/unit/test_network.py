"""The network (resnet_keras/model/network.py): parameter counts, precision of
the output, uint8 input, the logits twin, the auto kernels, normalisation
options, BlurPool, recomputation and drop path's rates and checkpoints.
(Synchronised batch norm over two replicas, a process of its own:
processes/test_network.py.)"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.config import hardware
from resnet_keras.model import layers
from resnet_keras.model import network as network_lib
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data.preprocessing import normalize_images
from tests.support.cpus import EPYC_AVX2, SAPPHIRE_RAPIDS
from tests.support import gradients
from tests.support.gradients import loss_and_grads


# Trainable parameters with 1000 classes (torchvision's published counts;
# ResNet-10 by hand: stem 9,536, stages 73,984 + 230,144 + 919,040 +
# 3,673,088, head 513,000).
EXPECTED_PARAMS = {10: 5_418_792, 18: 11_689_512, 34: 21_797_672,
                   50: 25_557_032, 101: 44_549_160, 152: 60_192_808}
# ResNet-18 with 10 classes: its head has 990 fewer units of 512 weights
# and a bias (the image size changes no parameter).
RESNET18_10_CLASSES = EXPECTED_PARAMS[18] - 990 * 513


@pytest.fixture(name='unfilled_kernels')
def _unfilled_kernels(monkeypatch):
  """For tests that read a network's structure (counts, shapes, strides):
  the kernels' shapes, not their values."""
  gradients.unfilled_kernels(monkeypatch)


@pytest.mark.parametrize('depth', sorted(EXPECTED_PARAMS))
def test_parameter_counts(depth, unfilled_kernels):
  model = network_lib.resnet(depth, 1000, 224)
  assert (network_lib.count_trainable_parameters(model) ==
          EXPECTED_PARAMS[depth])


def test_width_multiplier_scales_every_layer():
  cfg = RunConfig(resnet_depth=18, width_multiplier=0.25, stem='small',
                  image_size=28, dtype='fp32')
  network = network_lib.build_network(cfg, 10, use_regularizers=False)
  widths = {l.name: l.filters for l in network.layers
            if isinstance(l, tf_keras.layers.Conv2D)}
  assert widths['stem_conv'] == 16
  assert widths['stage1_block2_conv2'] == 16
  assert widths['stage2_block1_proj'] == widths['stage2_block1_conv1'] == 32
  assert widths['stage4_block2_conv2'] == 128
  assert network.name == 'resnet18' and cfg.model_name == 'resnet18_w0.25'
  # A quarter of the channels: about 1/16 of the 3x3 kernels' weights.
  assert 14 < RESNET18_10_CLASSES / network_lib.count_trainable_parameters(
      network) < 17
  # --stage_widths gives each stage its own.
  network = network_lib.build_network(
      dataclasses.replace(cfg, resnet_depth=10, stage_widths=(24, 48, 96, 256)),
      10, use_regularizers=False)
  widths = {l.name: l.filters for l in network.layers
            if isinstance(l, tf_keras.layers.Conv2D)}
  assert (widths['stem_conv'], widths['stage1_block1_conv2'],
          widths['stage2_block1_proj'], widths['stage3_block1_conv1'],
          widths['stage4_block1_conv2']) == (24, 24, 48, 96, 256)


def test_output_layer_has_one_unit_per_class(unfilled_kernels):
  model = network_lib.resnet(18, 7, 32)
  assert model.output_shape == (None, 7)


def test_v1_5_stride_is_on_the_3x3_conv(unfilled_kernels):
  model = network_lib.resnet(50, 10, 64)
  assert model.get_layer('stage2_block1_conv1').strides == (1, 1)
  assert model.get_layer('stage2_block1_conv2').strides == (2, 2)
  bn = model.get_layer('stem_bn')
  assert bn.momentum == 0.9 and bn.epsilon == 1e-5


@pytest.mark.parametrize('stem,stage1_size', [('imagenet', 8), ('small', 16),
                                               ('cifar', 32)])
def test_stem_sets_the_resolution_of_the_first_stage(stem, stage1_size,
                                                    unfilled_kernels):
  model = network_lib.resnet(18, 10, 32, stem=stem)
  stage1 = model.get_layer('stage1_block1_out').output_shape
  assert stage1 == (None, stage1_size, stage1_size, 64)
  # The stem changes no residual stage, only the stem conv's kernel.
  stem_kernel_delta = 64 * 3 * (7 * 7 - 3 * 3) if stem != 'imagenet' else 0
  assert (network_lib.count_trainable_parameters(model) ==
          RESNET18_10_CLASSES - stem_kernel_delta)


def test_bf16_policy_keeps_float32_softmax_and_variables(policy):
  policy('mixed_bfloat16')
  model = network_lib.resnet(18, 10, 32)
  out = model(tf.zeros([2, 32, 32, 3]))
  assert out.dtype == tf.float32
  assert all(v.dtype == tf.float32 for v in model.variables)
  assert model.get_layer('stem_conv').compute_dtype == 'bfloat16'


def test_uint8_input_normalised_on_device_matches_host_path():
  net = network_lib.resnet(18, 10, 32)
  pixels = np.random.RandomState(0).randint(0, 256, [3, 32, 32, 3])
  on_device = network_lib.build_training_model(net, 32, tf.uint8,
                                               normalize=normalize_images)
  on_host = network_lib.build_training_model(net, 32, tf.float32)
  a = on_device(tf.constant(pixels, tf.uint8), training=False)
  b = on_host(normalize_images(tf.constant(pixels)), training=False)
  np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('cfg', [
    RunConfig(resnet_depth=10, width_multiplier=0.25, image_size=32,
              data_loader_image_type='uint8'),
    RunConfig(keras_applications_model='ResNet50', image_size=32),
], ids=['resnet', 'keras_applications'])
def test_logits_model_is_the_training_model_before_its_softmax(cfg, tmp_path):
  """--loss=bce trains through it: the same variables, outputs whose softmax
  is the training model's, and no trace in the model's checkpoints."""
  pipeline_output = datasets.pipeline_output(cfg)
  network, model = network_lib.build_models(cfg, 10, use_regularizers=False,
                                            pipeline_output=pipeline_output)
  before = tf.train.Checkpoint(model=model).save(str(tmp_path / 'before'))
  logits_model = network_lib.build_logits_model(cfg, network,
                                                pipeline_output)
  assert [id(v) for v in logits_model.trainable_variables] == [
      id(v) for v in model.trainable_variables]
  pixels = np.random.RandomState(0).randint(0, 256, [2, 32, 32, 3])
  images = tf.constant(pixels, datasets.loader_dtype(cfg))
  np.testing.assert_allclose(
      tf.nn.softmax(logits_model(images, training=False)).numpy(),
      model(images, training=False).numpy(), rtol=1e-5, atol=1e-7)
  after = tf.train.Checkpoint(model=model).save(str(tmp_path / 'after'))
  assert tf.train.list_variables(after) == tf.train.list_variables(before)


def test_keras_applications_backbone_gets_our_head(unfilled_kernels):
  cfg = RunConfig(keras_applications_model='ResNet50V2', image_size=32)
  model = network_lib.build_network(cfg, 10, use_regularizers=False)
  assert model.output_shape == (None, 10)
  assert model.layers[-1].dtype_policy.compute_dtype == 'float32'


@pytest.mark.parametrize('setting,dtype,machine,conv,relu', [
    # bf16 on any CPU: matmul convolutions and the XLA add + ReLU.
    ('auto', 'bf16', 'amx', True, True), ('auto', 'bf16', 'avx2', True, True),
    # fp32: matmul convolutions only where there is no AVX-512.
    ('auto', 'fp32', 'amx', False, False), ('auto', 'fp32', 'avx2', True,
                                             False),
    # GPUs keep cuDNN and tf.nn.relu.
    ('auto', 'bf16', 'gpu', False, False), ('auto', 'fp32', 'gpu', False,
                                            False),
    ('forced', 'fp32', 'gpu', True, True), ('native', 'bf16', 'avx2', False,
                                            False)])
def test_auto_kernels_follow_the_dtype_and_the_machine(setting, dtype, machine,
                                                       conv, relu):
  """auto picks by measurements on each kind (levers.py); the forced
  setting applies anywhere, native nowhere."""
  machine = {'amx': hardware.Machine(SAPPHIRE_RAPIDS),
             'avx2': hardware.Machine(EPYC_AVX2),
             'gpu': hardware.Machine(EPYC_AVX2, ((8, 0),))}[machine]
  conv_cfg = RunConfig(conv_impl='matmul' if setting == 'forced' else setting,
                       dtype=dtype)
  relu_cfg = RunConfig(relu_impl='xla' if setting == 'forced' else setting,
                       dtype=dtype)
  assert hardware.uses_matmul_convs(conv_cfg.conv_impl, conv_cfg.dtype,
                                    machine) is conv
  assert (hardware.residual_relu(relu_cfg.relu_impl, relu_cfg.dtype,
                                 machine) == 'xla') is relu


@pytest.mark.parametrize('depth,norm', [(10, 'batch'), (50, 'group')])
def test_zero_init_residual_starts_each_block_as_its_shortcut(depth, norm):
  """Each residual branch's last norm (bn2 of a basic block, bn3 of a
  bottleneck) starts at gamma 0, every other norm at 1, so a block without
  a projection starts as relu(its input); one training step moves them."""
  cfg = RunConfig(resnet_depth=depth, width_multiplier=0.25, image_size=32,
                  norm=norm, groups=8, zero_init_residual=True)
  net = network_lib.build_network(cfg, 10, use_regularizers=False)
  last = 'bn3' if depth == 50 else 'bn2'
  norms = [l for l in net.layers if isinstance(
      l, (tf_keras.layers.BatchNormalization,
          tf_keras.layers.GroupNormalization))]
  zeroed = [l.name for l in norms if l.name.endswith('_' + last)]
  assert len(zeroed) == {10: 4, 50: 16}[depth]  # one per block
  for layer in norms:
    expected = 0.0 if layer.name in zeroed else 1.0
    np.testing.assert_array_equal(layer.gamma.numpy(), expected)
  # stage1_block1 of ResNet-10 has no projection: at init it passes its
  # (non-negative, pooled) input through unchanged.
  if depth == 10:
    block = tf_keras.Model(net.input, [
        net.get_layer('stem_pool').output,
        net.get_layer('stage1_block1_out').output])
    pooled, out = block(tf.random.normal([2, 32, 32, 3]), training=False)
    np.testing.assert_allclose(out, pooled, rtol=1e-6)
  # Without the flag the same norms start at 1.
  plain = network_lib.build_network(
      dataclasses.replace(cfg, zero_init_residual=False), 10,
      use_regularizers=False)
  np.testing.assert_array_equal(plain.get_layer(zeroed[0]).gamma.numpy(), 1.0)
  # One SGD step moves the zeroed scales off 0.
  images = tf.random.normal([4, 32, 32, 3])
  labels = tf.constant([0, 1, 2, 3])
  with tf.GradientTape() as tape:
    loss = tf_keras.losses.sparse_categorical_crossentropy(
        labels, net(images, training=True))
  variables = net.trainable_variables
  tf_keras.optimizers.legacy.SGD(0.1).apply_gradients(
      zip(tape.gradient(loss, variables), variables))
  for name in zeroed:
    assert np.any(net.get_layer(name).gamma.numpy() != 0), name


@pytest.mark.parametrize('depth,blurs', [(18, 4), (50, 7)])
def test_blurpool_blurs_before_each_wide_strided_conv_with_the_same_weights(
    depth, blurs, policy):
  """--blurpool: the stem's pool and each downsampling block's strided
  convolutions read blurred inputs (a basic block's conv1 and projection
  share one blur; a bottleneck's conv2 has its own); the weights are those
  of the plain network, the function is not."""
  cfg = RunConfig(resnet_depth=depth, width_multiplier=0.25, image_size=32)
  plain = network_lib.build_network(cfg, 10, use_regularizers=False)
  blurred = network_lib.build_network(
      dataclasses.replace(cfg, blurpool=True), 10, use_regularizers=False)
  names = [l.name for l in blurred.layers if isinstance(l, layers.Blur)]
  assert len(names) == blurs and 'stem_pool_blur' in names
  assert blurred.get_layer('stem_pool').strides == (1, 1)
  assert ([(v.name, v.shape) for v in plain.weights] ==
          [(v.name, v.shape) for v in blurred.weights])
  blurred.set_weights(plain.get_weights())
  images = tf.random.normal([2, 32, 32, 3])
  # Logits, not probabilities: a deep random network's softmax saturates to
  # the same one-hot either way.
  logits = lambda net: tf_keras.Model(net.input, net.get_layer('probs').input)(
      images, training=False)
  out = logits(blurred)
  assert out.shape == logits(plain).shape
  assert not np.allclose(out, logits(plain), atol=1e-3)
  if depth != 18:
    return
  # bf16 runs it too (the blur in the layer's compute dtype).
  policy('mixed_bfloat16')
  bf16 = network_lib.build_network(
      dataclasses.replace(cfg, blurpool=True, dtype='bf16'), 10,
      use_regularizers=False)
  bf16.set_weights(plain.get_weights())
  np.testing.assert_allclose(tf.cast(logits(bf16), tf.float32), out,
                             rtol=0.05, atol=0.05)


def _group_norm(groups=32):
  return network_lib.norm_factory('group', groups)


@pytest.mark.parametrize('depth', sorted(EXPECTED_PARAMS))
def test_group_norm_builds_every_depth_with_batch_norm_parameter_counts(
    depth, unfilled_kernels):
  # GroupNormalization has a gamma and beta per channel like batch norm, and
  # no moving statistics.
  model = network_lib.resnet(depth, 1000, 32, norm=_group_norm())
  assert (network_lib.count_trainable_parameters(model) ==
          EXPECTED_PARAMS[depth])
  assert not model.non_trainable_variables
  assert isinstance(model.get_layer('stage4_block1_bn1'),
                    tf_keras.layers.GroupNormalization)


@pytest.mark.parametrize('stem', ['imagenet', 'small', 'cifar'])
@pytest.mark.parametrize('groups', [32, 64, 1])
def test_group_norm_every_stem_normalises_each_group(stem, groups):
  # Only the stem is read: a ResNet-10 whose stages keep the stem's 64
  # channels (which every group count divides).
  model = network_lib.resnet(10, 10, 32, stem=stem, norm=_group_norm(groups),
                             filters=(64, 64, 64, 64))
  images = tf.random.stateless_normal([2, 32, 32, 3], seed=[0, 1])
  stem_bn = tf_keras.Model(model.input, model.get_layer('stem_bn').output)
  out = stem_bn(images, training=True).numpy()
  # Fresh gamma 1, beta 0: each image's group has mean 0 and variance 1.
  grouped = out.reshape(2, -1, groups, 64 // groups)
  np.testing.assert_allclose(grouped.mean(axis=(1, 3)), 0, atol=1e-4)
  np.testing.assert_allclose(grouped.var(axis=(1, 3)), 1, atol=1e-2)
  # Per-image: another image in the batch changes nothing.
  alone = stem_bn(images[:1], training=True).numpy()
  np.testing.assert_allclose(alone, out[:1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('matmul_convs', [False, True])
def test_group_norm_trains_a_step_in_bf16(matmul_convs, policy):
  policy('mixed_bfloat16')
  tf_keras.utils.set_random_seed(4)
  # A ResNet-10: the same layers as deeper ones, half the graph to trace.
  model = network_lib.resnet(10, 10, 32, stem='small', norm=_group_norm(),
                             matmul_convs=matmul_convs)
  optimizer = tf_keras.optimizers.legacy.SGD(0.01)
  images = tf.random.stateless_uniform([4, 32, 32, 3], seed=[2, 3])
  labels = tf.constant([0, 3, 5, 9])

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      probs = model(images, training=True)
      loss = tf.reduce_mean(
          tf_keras.losses.sparse_categorical_crossentropy(labels, probs))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return probs, loss, grads

  probs, loss, grads = step()
  assert probs.dtype == tf.float32
  np.testing.assert_allclose(tf.reduce_sum(probs, -1), 1.0, rtol=1e-5)
  assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
  losses = [float(loss)] + [float(step()[1]) for _ in range(4)]
  assert losses[-1] < losses[0], losses  # Five steps on one batch fit it.


@pytest.mark.slow
@pytest.mark.parametrize('norm,matmul_convs,depth,variables', [
    ('batch', False, 18, 62), ('group', False, 10, 38), ('batch', True, 10, 38)])
def test_recompute_gives_the_same_gradients(norm, matmul_convs, depth,
                                            variables, monkeypatch):
  """Each stage under tf.recompute_grad. ResNet-18's stages of two blocks
  with batch norm; group norm and the matmul convolutions recompute in a
  ResNet-10's one-block stages (the same layers, half the graph)."""
  tf_keras.utils.set_random_seed(5)
  plain = network_lib.resnet(depth, 10, 32,
                             norm=network_lib.norm_factory(norm),
                             matmul_convs=matmul_convs)
  gradients.unfilled_kernels(monkeypatch)  # It takes the plain weights.
  recompute = network_lib.resnet(depth, 10, 32,
                                 norm=network_lib.norm_factory(norm),
                                 matmul_convs=matmul_convs, recompute=True)
  assert isinstance(recompute, network_lib.StagewiseRecompute)
  recompute.set_weights(plain.get_weights())
  images = tf.random.stateless_normal([4, 32, 32, 3], seed=[6, 7])
  labels = tf.constant([1, 2, 3, 4])
  loss_plain, grads_plain = tf.function(loss_and_grads)(plain, images, labels)
  loss_re, grads_re = tf.function(loss_and_grads)(recompute, images, labels)
  np.testing.assert_allclose(loss_re, loss_plain, rtol=1e-5)
  assert len(grads_re) == len(grads_plain) == variables
  for g_re, g_plain in zip(grads_re, grads_plain):
    np.testing.assert_allclose(g_re, g_plain, rtol=1e-4,
                               atol=1e-5 * float(tf.reduce_max(abs(g_plain))))
  # Same weights in the same places, moving averages included (batch norm
  # in the stages updated twice at sqrt(0.9), the stem's once at 0.9).
  for a, b in zip(plain.get_weights(), recompute.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_recompute_checkpoints_are_interchangeable_and_average_once_per_step(
    tmp_path):
  """--enable_recompute's network (built from the config) keeps the plain
  one's checkpoint: the same variables, and it restores the plain one's
  (a run switching recompute on resumes). Batch norm in a stage runs
  twice under recompute (forward and recomputation); momentum sqrt(0.9)
  twice is one 0.9 update."""
  cfg = RunConfig(resnet_depth=18, image_size=32)
  tf_keras.utils.set_random_seed(8)
  plain = network_lib.build_network(cfg, 10, use_regularizers=False)
  recompute = network_lib.build_network(
      dataclasses.replace(cfg, enable_recompute=True), 10,
      use_regularizers=False)
  assert isinstance(recompute, network_lib.StagewiseRecompute)
  plain_path = tf.train.Checkpoint(model=plain).save(str(tmp_path / 'p'))
  re_path = tf.train.Checkpoint(model=recompute).save(str(tmp_path / 'r'))
  assert (tf.train.list_variables(plain_path) ==
          [(n, s) for n, s in tf.train.list_variables(re_path)])
  # Drawn apart, the same after the restore.
  assert not np.array_equal(plain.get_layer('stem_conv').kernel,
                            recompute.get_layer('stem_conv').kernel)
  status = tf.train.Checkpoint(model=recompute).restore(plain_path)
  status.assert_existing_objects_matched()
  for a, b in zip(plain.get_weights(), recompute.get_weights()):
    np.testing.assert_array_equal(a, b)

  images = tf.random.stateless_normal([4, 32, 32, 3], seed=[9, 10]) + 1.0
  labels = tf.constant([1, 2, 3, 4])
  before = plain.get_layer('stage3_block2_bn2').moving_mean.numpy()
  for model in (plain, recompute):
    tf.function(loss_and_grads)(model, images, labels)
  after_plain = plain.get_layer('stage3_block2_bn2').moving_mean.numpy()
  after_re = recompute.get_layer('stage3_block2_bn2').moving_mean.numpy()
  assert np.abs(after_plain - before).max() > 1e-3  # It moved...
  np.testing.assert_allclose(after_re, after_plain, rtol=1e-4, atol=1e-6)


def test_drop_path_rates_rise_linearly_over_the_blocks():
  np.testing.assert_allclose(network_lib.drop_path_rates(4, 0.3),
                             [0.0, 0.1, 0.2, 0.3])
  assert network_lib.drop_path_rates(1, 0.05) == [0.05]


def test_drop_path_trains_only_and_keeps_the_checkpoint_layout(tmp_path):
  """Drop path lives in the residual adds: the same layers and checkpoint
  at any rate (so runs warm-start and export across rates), and evaluation
  runs every branch."""
  small = dict(stem='cifar', filters=(8, 16, 16, 16))
  plain = network_lib.resnet(18, 10, 32, **small)
  dropping = network_lib.resnet(18, 10, 32, drop_path_rate=0.5, **small)
  assert [l.name for l in plain.layers] == [l.name for l in dropping.layers]
  adds = [l for l in dropping.layers if isinstance(l, layers.ResidualAdd)]
  np.testing.assert_allclose([l.drop_rate for l in adds],
                             network_lib.drop_path_rates(8, 0.5))
  for v in dropping.trainable_variables:
    v.assign(tf.random.normal(v.shape, stddev=0.1, seed=1))
  path = tf.train.Checkpoint(model=dropping).save(str(tmp_path / 'ckpt'))
  tf.train.Checkpoint(model=plain).restore(path).assert_existing_objects_matched()
  images = tf.random.normal([8, 32, 32, 3], seed=2)
  np.testing.assert_allclose(plain(images, training=False),
                             dropping(images, training=False), atol=1e-6)
  with layers.drop_path_seed(tf.constant([3, 4], tf.int64)):
    trained = dropping(images, training=True)
  assert not np.allclose(trained, plain(images, training=True), atol=1e-4)
