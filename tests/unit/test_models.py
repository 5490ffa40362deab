"""Model structure: parameter counts, precision of the output, uint8 input;
kernel choices, normalisation options and recomputation. (Synchronised
batch norm over two replicas, a process of its own: processes/.)"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras import hardware
from resnet_keras import models
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data.preprocessing import normalize_images
from tests.support.cpus import EPYC_AVX2, SAPPHIRE_RAPIDS

# Trainable parameters with 1000 classes (torchvision's published counts;
# ResNet-10 by hand: stem 9,536, stages 73,984 + 230,144 + 919,040 +
# 3,673,088, head 513,000).
EXPECTED_PARAMS = {10: 5_418_792, 18: 11_689_512, 34: 21_797_672,
                   50: 25_557_032, 101: 44_549_160, 152: 60_192_808}


@pytest.mark.parametrize('depth', sorted(EXPECTED_PARAMS))
def test_parameter_counts(depth):
  model = models.resnet(depth, 1000, 224)
  assert models.count_trainable_parameters(model) == EXPECTED_PARAMS[depth]


def test_width_multiplier_scales_every_layer():
  cfg = RunConfig(resnet_depth=18, width_multiplier=0.25, stem='small',
                  image_size=28, dtype='fp32')
  network = models.build_network(cfg, 10, use_regularizers=False)
  widths = {l.name: l.filters for l in network.layers
            if isinstance(l, tf_keras.layers.Conv2D)}
  assert widths['stem_conv'] == 16
  assert widths['stage1_block2_conv2'] == 16
  assert widths['stage2_block1_proj'] == widths['stage2_block1_conv1'] == 32
  assert widths['stage4_block2_conv2'] == 128
  assert network.name == 'resnet18' and cfg.model_name == 'resnet18_w0.25'
  # A quarter of the channels: about 1/16 of the 3x3 kernels' weights.
  full = models.count_trainable_parameters(models.resnet(18, 10, 28))
  assert 14 < full / models.count_trainable_parameters(network) < 17
  # --stage_widths gives each stage its own.
  network = models.build_network(
      dataclasses.replace(cfg, resnet_depth=10, stage_widths=(24, 48, 96, 256)),
      10, use_regularizers=False)
  widths = {l.name: l.filters for l in network.layers
            if isinstance(l, tf_keras.layers.Conv2D)}
  assert (widths['stem_conv'], widths['stage1_block1_conv2'],
          widths['stage2_block1_proj'], widths['stage3_block1_conv1'],
          widths['stage4_block1_conv2']) == (24, 24, 48, 96, 256)


def test_output_layer_has_one_unit_per_class():
  model = models.resnet(18, 7, 32)
  assert model.output_shape == (None, 7)


def test_v1_5_stride_is_on_the_3x3_conv():
  model = models.resnet(50, 10, 64)
  assert model.get_layer('stage2_block1_conv1').strides == (1, 1)
  assert model.get_layer('stage2_block1_conv2').strides == (2, 2)
  bn = model.get_layer('stem_bn')
  assert bn.momentum == 0.9 and bn.epsilon == 1e-5


@pytest.mark.parametrize('stem,stage1_size', [('imagenet', 8), ('small', 16),
                                               ('cifar', 32)])
def test_stem_sets_the_resolution_of_the_first_stage(stem, stage1_size):
  model = models.resnet(18, 10, 32, stem=stem)
  stage1 = model.get_layer('stage1_block1_out').output_shape
  assert stage1 == (None, stage1_size, stage1_size, 64)
  # The stem changes no residual stage, only the stem conv's kernel.
  base = models.count_trainable_parameters(models.resnet(18, 10, 32))
  stem_kernel_delta = 64 * 3 * (7 * 7 - 3 * 3) if stem != 'imagenet' else 0
  assert models.count_trainable_parameters(model) == base - stem_kernel_delta


def test_bf16_policy_keeps_float32_softmax_and_variables(policy):
  policy('mixed_bfloat16')
  model = models.resnet(18, 10, 32)
  out = model(tf.zeros([2, 32, 32, 3]))
  assert out.dtype == tf.float32
  assert all(v.dtype == tf.float32 for v in model.variables)
  assert model.get_layer('stem_conv').compute_dtype == 'bfloat16'


def test_uint8_input_normalised_on_device_matches_host_path():
  net = models.resnet(18, 10, 32)
  pixels = np.random.RandomState(0).randint(0, 256, [3, 32, 32, 3])
  on_device = models.build_training_model(net, 32, tf.uint8,
                                          normalize_on_device=True)
  on_host = models.build_training_model(net, 32, tf.float32,
                                        normalize_on_device=False)
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
  network, model = models.build_models(cfg, 10, use_regularizers=False)
  before = tf.train.Checkpoint(model=model).save(str(tmp_path / 'before'))
  logits_model = models.build_logits_model(cfg, network)
  assert [id(v) for v in logits_model.trainable_variables] == [
      id(v) for v in model.trainable_variables]
  pixels = np.random.RandomState(0).randint(0, 256, [2, 32, 32, 3])
  images = tf.constant(pixels, datasets.loader_dtype(cfg))
  np.testing.assert_allclose(
      tf.nn.softmax(logits_model(images, training=False)).numpy(),
      model(images, training=False).numpy(), rtol=1e-5, atol=1e-7)
  after = tf.train.Checkpoint(model=model).save(str(tmp_path / 'after'))
  assert tf.train.list_variables(after) == tf.train.list_variables(before)


def test_keras_applications_backbone_gets_our_head():
  cfg = RunConfig(keras_applications_model='ResNet50V2', image_size=32)
  model = models.build_network(cfg, 10, use_regularizers=False)
  assert model.output_shape == (None, 10)
  assert model.layers[-1].dtype_policy.compute_dtype == 'float32'


def _loss_and_grads(model, images, labels, training=True):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf_keras.losses.sparse_categorical_crossentropy(
        labels, model(images, training=training)))
  return loss, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize('out_pixels,in_channels,stride,dtype,patches', [
    (49, 512, 1, 'float32', True),  # ResNet-50's last stage at 224 px
    (49, 256, 2, 'bfloat16', True),
    (49, 128, 2, 'bfloat16', False),
    (64, 512, 1, 'bfloat16', False),  # 8x8: no longer a small map
    (4, 64, 1, 'float32', True),  # 2x2 maps from 64 channels, any dtype
    (4, 32, 2, 'bfloat16', False),
    (16, 64, 2, 'bfloat16', True),  # bf16, strided, to 4x4
    (16, 64, 2, 'float32', False),
    (16, 64, 1, 'bfloat16', False),
    (16, 256, 1, 'float32', True),
])
def test_kernel_gradients_go_through_patches_on_small_maps(
    out_pixels, in_channels, stride, dtype, patches):
  assert models.kernel_grad_by_patches(out_pixels, in_channels, stride,
                                       dtype) is patches


def test_matmul_convs_pick_the_kernel_gradient_per_layer(monkeypatch, policy):
  # fashion_mnist_94's network in bf16: 28 px, small stem, 32-64-128-256.
  picked = []
  original = models.conv_with_patch_matmul_kernel_grad

  def recording(inputs, kernel, stride):
    picked.append((inputs.shape[1], inputs.shape[3], stride))
    return original(inputs, kernel, stride)

  monkeypatch.setattr(models, 'conv_with_patch_matmul_kernel_grad', recording)
  policy('mixed_bfloat16')
  models.resnet(10, 10, 28, stem='small', matmul_convs=True,
                filters=(32, 64, 128, 256))
  # (input map, input channels, stride): the strided 3x3s into stages 3
  # and 4, and stage 4's unstrided one; not stages 1-2 nor 4x4 unstrided.
  assert sorted(set(picked)) == [(2, 256, 1), (4, 128, 2), (7, 64, 2)]


@pytest.mark.parametrize('depth,image_size', [(50, 64), (18, 28)])
def test_matmul_convs_match_native_outputs_and_gradients(depth, image_size,
                                                        policy):
  # ResNet-50 at 64 px: stride-1 and stride-2 1x1 convolutions, 3x3 ones on
  # 2x2 maps with 512 channels. ResNet-18 at 28 px (small stem): stride-2
  # 3x3 convolutions from 4x4 to 2x2 and odd map sizes (7 -> 4).
  stem = 'imagenet' if depth == 50 else 'small'
  tf_keras.utils.set_random_seed(3)  # Fixed weights: a stable comparison.
  native = models.resnet(depth, 10, image_size, stem=stem)
  matmul = models.resnet(depth, 10, image_size, stem=stem, matmul_convs=True)
  assert isinstance(matmul.get_layer('stage4_block1_conv1'),
                    models.MatmulConv2D)
  matmul.set_weights(native.get_weights())  # Same variables, same order.
  # The same network in float64: what both float32 paths approximate.
  policy('float64')
  exact = models.resnet(depth, 10, image_size, stem=stem)
  policy('float32')
  assert exact.get_layer('stem_conv').kernel.dtype == tf.float64
  exact.set_weights([w.astype(np.float64) for w in native.get_weights()])
  images = tf.random.stateless_uniform([3, image_size, image_size, 3],
                                       seed=[1, 2])
  labels = tf.constant([1, 4, 7])

  # Inference-mode batch norm: batch statistics of 3 images at 2x2 px would
  # amplify rounding differences far beyond the convolutions'.
  loss_native, grads_native = _loss_and_grads(native, images, labels,
                                              training=False)
  loss_matmul, grads_matmul = _loss_and_grads(matmul, images, labels,
                                              training=False)
  _, grads_exact = _loss_and_grads(exact, tf.cast(images, tf.float64),
                                   labels, training=False)
  np.testing.assert_allclose(loss_matmul, loss_native, rtol=1e-4)
  # Random ResNet-50 weights without batch statistics make float32 rounding
  # grow layer by layer (native kernels: up to ~8% of a gradient's scale),
  # by an amount that depends on the kernels' summation order (Eigen, or
  # oneDNN for each CPU's ISA). So the matmul path is held to the native
  # path's own float32 error, measured against float64.
  for g_matmul, g_native, g_exact in zip(grads_matmul, grads_native,
                                         grads_exact):
    scale = float(np.max(np.abs(g_exact)))
    native_error = float(np.max(np.abs(g_native.numpy() - g_exact.numpy())))
    matmul_error = float(np.max(np.abs(g_matmul.numpy() - g_exact.numpy())))
    assert matmul_error <= max(2 * native_error, 1e-5 * scale), (
        matmul_error, native_error, scale)


@pytest.mark.parametrize('matmul_convs', [False, True])
def test_a_bf16_network_runs_eagerly_as_inside_tf_function(matmul_convs,
                                                           policy):
  """Called eagerly, forward and under a GradientTape (a notebook, a loop of
  one's own), a bf16 network gives what it gives inside tf.function. The
  matmul convolutions' custom gradients once refused eager calls under the
  mixed policy ('grad_fn must accept keyword argument variables')."""
  policy('mixed_bfloat16')
  tf_keras.utils.set_random_seed(6)
  # The small stem at 28 px: stage 3's strided 3x3 (to 4x4) and stage 4's
  # (to 2x2, 64 channels) take the patches kernel gradient.
  net = models.resnet(10, 10, 28, stem='small', matmul_convs=matmul_convs,
                      filters=(16, 32, 64, 64))
  images = tf.random.stateless_uniform([2, 28, 28, 3], seed=[3, 4])
  labels = tf.constant([1, 7])
  eager_loss, eager_grads = _loss_and_grads(net, images, labels)
  graph_loss, graph_grads = tf.function(_loss_and_grads)(net, images, labels)
  assert net(images).dtype == tf.float32  # Eager inference.
  np.testing.assert_allclose(eager_loss, graph_loss, rtol=1e-2)
  for eager, graph in zip(eager_grads, graph_grads):
    scale = float(np.max(np.abs(graph))) or 1.0
    np.testing.assert_allclose(eager / scale, graph / scale, atol=2e-2)


@pytest.mark.parametrize('shape,stride', [
    ((3, 14, 14, 5), 2), ((3, 7, 7, 5), 2), ((2, 5, 6, 3), 2),
    ((2, 9, 7, 4), 3), ((2, 4, 4, 3), 1)])
@pytest.mark.parametrize('dtype', [tf.float32, tf.bfloat16])
def test_subsample_is_the_strided_slice_and_its_gradient(shape, stride, dtype):
  x = tf.cast(tf.random.stateless_normal(shape, seed=[3, 4]), dtype)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    expected = x[:, ::stride, ::stride, :]
    weights = tf.cast(tf.random.stateless_normal(expected.shape, seed=[5, 6]),
                      dtype)
    ours = models.subsample(x, stride)
    losses = [tf.reduce_sum(y * weights) for y in (ours, expected)]
  np.testing.assert_array_equal(ours.numpy(), expected.numpy())
  np.testing.assert_array_equal(tape.gradient(losses[0], x).numpy(),
                                tape.gradient(losses[1], x).numpy())
  # Traced without the map's size: the strided slice itself.
  unsized = tf.function(lambda v: models.subsample(v, stride),
                        input_signature=[tf.TensorSpec([None, None, None,
                                                        shape[3]], dtype)])
  np.testing.assert_array_equal(unsized(x).numpy(), expected.numpy())


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


_SPECIAL = [0.0, -0.0, 1.5, -1.5, 3e38, -3e38, 1e-40, -1e-40, 1e-6, -1e-6,
            np.inf, -np.inf, np.nan]


@pytest.mark.parametrize('dtype', [tf.bfloat16, tf.float16, tf.float32])
def test_bitwise_relu_equals_relu_and_its_gradient(dtype):
  x = tf.cast(tf.concat([tf.constant(_SPECIAL, tf.float32),
                         tf.random.stateless_normal([1000], [3, 4]) * 10], 0),
              dtype)
  dy = tf.cast(tf.random.stateless_normal(x.shape, [5, 6]), dtype)
  results = []
  for relu in (tf.nn.relu, models._bitwise_relu):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = relu(x)
    results.append((y, tape.gradient(y, x, output_gradients=dy)))
  (y, dx), (y_bitwise, dx_bitwise) = results
  # TensorFlow's CPU kernels read subnormals as 0 (so tf.nn.relu returns 0
  # for them); the bitwise ReLU passes a positive one through, and every
  # later kernel reads it as 0 again (the gradients below agree).
  x32 = tf.cast(x, tf.float32).numpy()
  smallest_normal = 2.0**-14 if dtype == tf.float16 else 2.0**-126
  subnormal = (x32 > 0) & (x32 < smallest_normal)
  assert subnormal.any()
  np.testing.assert_array_equal(
      tf.cast(y_bitwise, tf.float32),
      np.where(subnormal, x32, tf.cast(y, tf.float32)))  # NaN where NaN
  np.testing.assert_array_equal(tf.cast(dx_bitwise, tf.float32),
                                tf.cast(dx, tf.float32))
  assert y_bitwise.dtype == dtype


def test_residual_relu_is_bitwise_only_in_training():
  # A negative NaN (x86's default NaN, e.g. inf - inf) is the one input the
  # bitwise ReLU maps differently: 0, not NaN. Evaluation must keep NaN.
  negative_nan = -tf.constant([np.nan], tf.bfloat16)
  assert np.signbit(tf.cast(negative_nan, tf.float32).numpy()[0])
  layer = models.ResidualRelu('bitwise')
  assert layer(negative_nan, training=True).numpy()[0] == 0
  assert np.isnan(float(layer(negative_nan, training=False)[0]))
  assert np.isnan(float(models.ResidualRelu()(negative_nan, training=True)[0]))


@pytest.mark.parametrize('dtype', [tf.bfloat16, tf.float32])
def test_xla_add_relu_equals_add_then_relu_and_its_gradient(dtype):
  specials = tf.constant(_SPECIAL + [-np.nan], tf.float32)
  a = tf.cast(tf.concat([specials, tf.random.stateless_normal([1000], [3, 4])
                         * 10], 0), dtype)
  b = tf.cast(tf.random.stateless_normal(a.shape, [7, 8]) * 10, dtype)
  dy = tf.cast(tf.random.stateless_normal(a.shape, [5, 6]), dtype)
  dy = tf.tensor_scatter_nd_update(dy, [[3], [20]], tf.constant([np.nan] * 2,
                                                                dtype))
  results = []
  for add_relu in (lambda a, b: tf.nn.relu(a + b), models._xla_add_relu):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch([a, b])
      y = add_relu(a, b)
    results.append([tf.cast(t, tf.float32).numpy() for t in (
        y, *tape.gradient(y, [a, b], output_gradients=dy))])
  for native, xla in zip(*results):
    np.testing.assert_array_equal(xla, native)  # NaN where NaN
  assert np.isnan(results[1][0][-1001])  # relu(-NaN + b) stays NaN.
  assert np.isnan(results[1][1]).sum() >= 1  # A NaN dy stays NaN.


def test_residual_layers_fuse_only_in_training():
  a = tf.constant([[-2.0, 1.0, np.nan]])
  b = tf.constant([[1.0, 1.0, 0.0]])
  add, relu = models.ResidualAdd('xla'), models.ResidualRelu('xla')
  np.testing.assert_array_equal(add([a, b], training=True), [[0, 2, np.nan]])
  np.testing.assert_array_equal(relu(a, training=True), a)  # Already applied.
  np.testing.assert_array_equal(add([a, b], training=False), [[-1, 2, np.nan]])
  np.testing.assert_array_equal(relu(a, training=False), [[0, 1, np.nan]])


@pytest.mark.parametrize('impl', ['bitwise', 'xla'])
def test_fast_residual_relus_train_bit_identically(impl, policy):
  policy('mixed_bfloat16')
  native = models.resnet(50, 10, 32)
  fast = models.resnet(50, 10, 32, residual_relu=impl)
  policy('float32')
  assert fast.get_layer('stage1_block1_out').impl == impl
  assert [l.name for l in fast.layers] == [l.name for l in native.layers]
  fast.set_weights(native.get_weights())
  images = tf.random.stateless_normal([4, 32, 32, 3], [1, 2]) * 50
  labels = tf.constant([1, 4, 7, 9])

  loss_native, grads_native = _loss_and_grads(native, images, labels)
  loss_fast, grads_fast = _loss_and_grads(fast, images, labels)
  assert float(loss_fast) == float(loss_native)
  for g_fast, g_native in zip(grads_fast, grads_native):
    np.testing.assert_array_equal(g_fast, g_native)


@pytest.mark.parametrize('depth,norm', [(10, 'batch'), (50, 'group')])
def test_zero_init_residual_starts_each_block_as_its_shortcut(depth, norm):
  """Each residual branch's last norm (bn2 of a basic block, bn3 of a
  bottleneck) starts at gamma 0, every other norm at 1, so a block without
  a projection starts as relu(its input); one training step moves them."""
  cfg = RunConfig(resnet_depth=depth, width_multiplier=0.25, image_size=32,
                  norm=norm, groups=8, zero_init_residual=True)
  net = models.build_network(cfg, 10, use_regularizers=False)
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
  plain = models.build_network(
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


def test_blur_filter_is_a_normalised_symmetric_binomial():
  kernel = models.blur_filter().numpy()
  np.testing.assert_allclose(kernel * 16, [[1, 2, 1], [2, 4, 2], [1, 2, 1]])
  assert kernel.sum() == pytest.approx(1.0)
  np.testing.assert_array_equal(kernel, kernel.T)
  np.testing.assert_array_equal(kernel, kernel[::-1, ::-1])
  # A constant image stays constant inside ('same' pads with zeros), each
  # channel on its own; stride 2 subsamples after blurring.
  image = tf.ones([1, 6, 6, 2]) * tf.constant([3.0, -1.0])
  blurred = models.Blur()(image).numpy()
  np.testing.assert_allclose(blurred[0, 1:-1, 1:-1], image[0, 1:-1, 1:-1])
  assert blurred[0, 0, 0, 0] == pytest.approx(3.0 * 9 / 16)  # a corner
  strided = models.Blur(strides=2)(image)
  assert strided.shape == (1, 3, 3, 2)
  # TensorFlow's 'same' at stride 2 on an even size pads below and right
  # only: output i is centred on input 2i + 1.
  np.testing.assert_array_equal(strided, blurred[:, 1::2, 1::2])
  # An impulse spreads into the filter itself.
  impulse = np.zeros([1, 5, 5, 1], np.float32)
  impulse[0, 2, 2, 0] = 1
  np.testing.assert_allclose(models.Blur()(impulse)[0, 1:4, 1:4, 0], kernel)


@pytest.mark.parametrize('depth,blurs', [(18, 4), (50, 7)])
def test_blurpool_blurs_before_each_wide_strided_conv_with_the_same_weights(
    depth, blurs, policy):
  """--blurpool: the stem's pool and each downsampling block's strided
  convolutions read blurred inputs (a basic block's conv1 and projection
  share one blur; a bottleneck's conv2 has its own); the weights are those
  of the plain network, the function is not."""
  cfg = RunConfig(resnet_depth=depth, width_multiplier=0.25, image_size=32)
  plain = models.build_network(cfg, 10, use_regularizers=False)
  blurred = models.build_network(dataclasses.replace(cfg, blurpool=True), 10,
                                 use_regularizers=False)
  names = [l.name for l in blurred.layers if isinstance(l, models.Blur)]
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
  bf16 = models.build_network(
      dataclasses.replace(cfg, blurpool=True, dtype='bf16'), 10,
      use_regularizers=False)
  bf16.set_weights(plain.get_weights())
  np.testing.assert_allclose(tf.cast(logits(bf16), tf.float32), out,
                             rtol=0.05, atol=0.05)


def _pairs_of(kernel, used):
  """The first 2 * used filters of `kernel` as (direction, its negative)."""
  flat = kernel.reshape(-1, kernel.shape[-1])
  return [(flat[:, 2 * i], flat[:, 2 * i + 1]) for i in range(used)]


@pytest.mark.parametrize('filters,used,held', [(8, 3, 1.0), (4, 2, 26 / 28)])
def test_pca_stem_kernel_takes_the_largest_directions_in_pairs(filters, used,
                                                               held):
  # Patches along the axes: variances 18/5, 2/5, 8/5 and 0 (np.cov's n - 1),
  # so the directions by variance are axes 0, 2, 1; axis 3 has none.
  patches = np.array([[3., 0, 0, 0], [-3, 0, 0, 0], [0, 1, 0, 0],
                      [0, -1, 0, 0], [0, 0, 2, 0], [0, 0, -2, 0]])
  kernel = np.random.default_rng(0).normal(size=(1, 1, 4, filters))
  norm = np.sqrt(np.mean(np.sum(kernel.reshape(4, -1) ** 2, axis=0)))
  result, got_used, got_held = models.pca_stem_kernel(patches, kernel)
  assert (got_used, result.shape) == (used, kernel.shape)
  assert got_held == pytest.approx(held)
  for (plus, minus), axis in zip(_pairs_of(result, used), (0, 2, 1)):
    np.testing.assert_allclose(np.abs(plus), np.eye(4)[axis] * norm,
                               atol=1e-12)
    np.testing.assert_array_equal(minus, -plus)
  # The filters past the pairs keep their random values.
  np.testing.assert_array_equal(result[..., 2 * used:],
                                kernel[..., 2 * used:])


def test_stem_patches_are_laid_out_as_the_kernel():
  images = tf.reshape(tf.range(2 * 4 * 4 * 3, dtype=tf.float32), [2, 4, 4, 3])
  patches = models.stem_patches(images, 2)
  assert patches.shape == (2 * 4, 2 * 2 * 3)
  # Row 3: the first image's bottom-right patch, flattened as a Conv2D
  # kernel's (height, width, channels) axes: its dot product with a kernel
  # filter is the convolution's output there.
  np.testing.assert_array_equal(patches[3],
                                images[0, 2:4, 2:4, :].numpy().reshape(-1))
  assert models.pca_image_count(28, 3) == 1235  # 81 patches an image
  assert models.pca_image_count(224, 7) == 98


def test_pca_stem_on_grey_images_uses_their_rank_and_decorrelates():
  """Grey images in RGB: 3x3 patches have rank 9, so 18 of the small stem's
  32 filters become +/- pairs of orthogonal directions, and the stem's
  outputs along them are uncorrelated on the images it was fitted to."""
  rng = np.random.default_rng(1)
  grey = rng.integers(0, 256, size=(64, 28, 28, 1)).astype(np.float32)
  grey = tf.nn.avg_pool2d(grey, 3, 1, 'SAME')  # neighbours correlate
  images = normalize_images(tf.repeat(grey, 3, axis=-1))
  tf_keras.utils.set_random_seed(2)
  net = models.resnet(10, 10, 28, stem='small', filters=(32, 16, 16, 16))
  before = net.get_layer(models.STEM_CONV).kernel.numpy()
  used, filters, held = models.init_stem_from_images(net, images)
  assert (used, filters) == (9, 32) and held == pytest.approx(1.0)
  after = net.get_layer(models.STEM_CONV).kernel.numpy()
  np.testing.assert_array_equal(after[..., 18:], before[..., 18:])
  directions = np.stack([plus for plus, _ in _pairs_of(after, used)])
  gram = directions @ directions.T
  np.testing.assert_allclose(gram, np.diag(np.diag(gram)), atol=1e-5)
  responses = models.stem_patches(images, 3) @ directions.T
  correlation = np.corrcoef(responses, rowvar=False)
  np.testing.assert_allclose(correlation, np.eye(9), atol=1e-6)
  # A random stem's responses are strongly correlated: what PCA removes.
  random_responses = models.stem_patches(images, 3) @ before.reshape(27, -1)
  off_diagonal = np.corrcoef(random_responses, rowvar=False)[np.triu_indices(
      32, 1)]
  assert np.max(np.abs(off_diagonal)) > 0.5


def test_group_normalization_is_keras_without_the_mask_weighting():
  x = tf.random.normal([3, 5, 7, 16], seed=1) * 3 + 1
  ours = models.GroupNormalization(4, epsilon=1e-3)
  keras = tf_keras.layers.GroupNormalization(4, epsilon=1e-3)
  for layer in (ours, keras):
    layer.build(x.shape)
    layer.set_weights([np.arange(16, dtype=np.float32) / 8 - 1,
                       np.linspace(-1, 1, 16).astype(np.float32)])
  np.testing.assert_allclose(ours(x), keras(x), rtol=1e-5, atol=1e-5)
  # Each group of 4 channels has mean beta and scale gamma per channel.
  unit = models.GroupNormalization(4, epsilon=0.0)(x).numpy()
  grouped = unit.reshape(3, 5 * 7, 4, 4)
  np.testing.assert_allclose(grouped.mean(axis=(1, 3)), 0, atol=1e-5)
  np.testing.assert_allclose(grouped.std(axis=(1, 3)), 1, atol=1e-3)
  mask = tf.cast(tf.random.uniform(x.shape, seed=2) > 0.3, tf.float32)
  np.testing.assert_allclose(ours(x, mask=mask), keras(x, mask=mask),
                             rtol=1e-5, atol=1e-5)


def _group_norm(groups=32):
  return models.norm_factory('group', groups)


@pytest.mark.parametrize('depth', sorted(EXPECTED_PARAMS))
def test_group_norm_builds_every_depth_with_batch_norm_parameter_counts(depth):
  # GroupNormalization has a gamma and beta per channel like batch norm, and
  # no moving statistics.
  model = models.resnet(depth, 1000, 32, norm=_group_norm())
  assert models.count_trainable_parameters(model) == EXPECTED_PARAMS[depth]
  assert not model.non_trainable_variables
  assert isinstance(model.get_layer('stage4_block1_bn1'),
                    tf_keras.layers.GroupNormalization)


@pytest.mark.parametrize('stem', ['imagenet', 'small', 'cifar'])
@pytest.mark.parametrize('groups', [32, 64, 1])
def test_group_norm_every_stem_normalises_each_group(stem, groups):
  model = models.resnet(18, 10, 32, stem=stem, norm=_group_norm(groups))
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
  model = models.resnet(18, 10, 32, stem='small', norm=_group_norm(),
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
@pytest.mark.parametrize('norm,matmul_convs', [('batch', False),
                                               ('group', False),
                                               ('batch', True)])
def test_recompute_gives_the_same_gradients(norm, matmul_convs):
  tf_keras.utils.set_random_seed(5)
  plain = models.resnet(18, 10, 32, norm=models.norm_factory(norm),
                        matmul_convs=matmul_convs)
  recompute = models.resnet(18, 10, 32, norm=models.norm_factory(norm),
                            matmul_convs=matmul_convs, recompute=True)
  assert isinstance(recompute, models.StagewiseRecompute)
  recompute.set_weights(plain.get_weights())
  images = tf.random.stateless_normal([4, 32, 32, 3], seed=[6, 7])
  labels = tf.constant([1, 2, 3, 4])
  loss_plain, grads_plain = tf.function(_loss_and_grads)(plain, images, labels)
  loss_re, grads_re = tf.function(_loss_and_grads)(recompute, images, labels)
  np.testing.assert_allclose(loss_re, loss_plain, rtol=1e-5)
  assert len(grads_re) == len(grads_plain) == 62
  for g_re, g_plain in zip(grads_re, grads_plain):
    np.testing.assert_allclose(g_re, g_plain, rtol=1e-4,
                               atol=1e-5 * float(tf.reduce_max(abs(g_plain))))
  # Same weights in the same places, moving averages included (batch norm
  # in the stages updated twice at sqrt(0.9), the stem's once at 0.9).
  for a, b in zip(plain.get_weights(), recompute.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_recompute_moving_averages_match_one_update_per_step():
  """Batch norm in a stage runs twice under recompute (forward and
  recomputation); momentum sqrt(0.9) twice is one 0.9 update."""
  cfg = RunConfig(resnet_depth=18, image_size=32)
  tf_keras.utils.set_random_seed(8)
  plain = models.build_network(cfg, 10, use_regularizers=False)
  recompute = models.build_network(
      RunConfig(resnet_depth=18, image_size=32, enable_recompute=True), 10,
      use_regularizers=False)
  recompute.set_weights(plain.get_weights())
  images = tf.random.stateless_normal([4, 32, 32, 3], seed=[9, 10]) + 1.0
  labels = tf.constant([1, 2, 3, 4])
  before = plain.get_layer('stage3_block2_bn2').moving_mean.numpy()
  for model in (plain, recompute):
    tf.function(_loss_and_grads)(model, images, labels)
  after_plain = plain.get_layer('stage3_block2_bn2').moving_mean.numpy()
  after_re = recompute.get_layer('stage3_block2_bn2').moving_mean.numpy()
  assert np.abs(after_plain - before).max() > 1e-3  # It moved...
  np.testing.assert_allclose(after_re, after_plain, rtol=1e-4, atol=1e-6)


def test_recompute_checkpoints_are_interchangeable(tmp_path):
  plain = models.resnet(18, 10, 32)
  recompute = models.resnet(18, 10, 32, recompute=True)
  plain_path = tf.train.Checkpoint(model=plain).save(str(tmp_path / 'p'))
  re_path = tf.train.Checkpoint(model=recompute).save(str(tmp_path / 'r'))
  assert (tf.train.list_variables(plain_path) ==
          [(n, s) for n, s in tf.train.list_variables(re_path)])
  status = tf.train.Checkpoint(model=recompute).restore(plain_path)
  status.assert_existing_objects_matched()
  for a, b in zip(plain.get_weights(), recompute.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_drop_path_rates_rise_linearly_over_the_blocks():
  np.testing.assert_allclose(models.drop_path_rates(4, 0.3),
                             [0.0, 0.1, 0.2, 0.3])
  assert models.drop_path_rates(1, 0.05) == [0.05]


def test_drop_path_keeps_the_expectation_and_drops_whole_examples():
  branch = tf.ones([4000, 2, 2, 3])
  with models.drop_path_seed(tf.constant([1, 2], tf.int64)):
    dropped = models.drop_path(branch, 0.2, index=3).numpy()
    again = models.drop_path(branch, 0.2, index=3).numpy()
    other_block = models.drop_path(branch, 0.2, index=4).numpy()
  per_example = dropped.reshape(4000, -1)
  # Every example keeps or drops its whole branch, survivors x 1/0.8.
  assert set(np.unique(per_example)) == {0.0, 1.25}
  assert np.all(per_example.min(1) == per_example.max(1))
  assert abs(per_example.mean() - 1.0) < 0.05  # the expectation: the branch
  np.testing.assert_array_equal(dropped, again)  # a function of the seed
  assert np.any(dropped != other_block)  # each block draws its own


def test_drop_path_trains_only_and_keeps_the_checkpoint_layout(tmp_path):
  """Drop path lives in the residual adds: the same layers and checkpoint
  at any rate (so runs warm-start and export across rates), and evaluation
  runs every branch."""
  small = dict(stem='cifar', filters=(8, 16, 16, 16))
  plain = models.resnet(18, 10, 32, **small)
  dropping = models.resnet(18, 10, 32, drop_path_rate=0.5, **small)
  assert [l.name for l in plain.layers] == [l.name for l in dropping.layers]
  adds = [l for l in dropping.layers if isinstance(l, models.ResidualAdd)]
  np.testing.assert_allclose([l.drop_rate for l in adds],
                             models.drop_path_rates(8, 0.5))
  for v in dropping.trainable_variables:
    v.assign(tf.random.normal(v.shape, stddev=0.1, seed=1))
  path = tf.train.Checkpoint(model=dropping).save(str(tmp_path / 'ckpt'))
  tf.train.Checkpoint(model=plain).restore(path).assert_existing_objects_matched()
  images = tf.random.normal([8, 32, 32, 3], seed=2)
  np.testing.assert_allclose(plain(images, training=False),
                             dropping(images, training=False), atol=1e-6)
  with models.drop_path_seed(tf.constant([3, 4], tf.int64)):
    trained = dropping(images, training=True)
  assert not np.allclose(trained, plain(images, training=True), atol=1e-4)
