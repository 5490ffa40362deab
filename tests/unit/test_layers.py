"""The network's own layers and the ops they run (resnet_keras/model/layers.py)
against what each stands for: the matmul convolutions and their kernel
gradients, the bitwise and XLA ReLUs, the blur, group norm and drop path."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.model import layers
from resnet_keras.model import network as network_lib
from tests.support import gradients
from tests.support.gradients import loss_and_grads


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
  assert layers.kernel_grad_by_patches(out_pixels, in_channels, stride,
                                       dtype) is patches


def test_matmul_convs_pick_the_kernel_gradient_per_layer(monkeypatch, policy):
  # fashion_mnist_94's network in bf16: 28 px, small stem, 32-64-128-256.
  picked = []
  original = layers.conv_with_patch_matmul_kernel_grad

  def recording(inputs, kernel, stride):
    picked.append((inputs.shape[1], inputs.shape[3], stride))
    return original(inputs, kernel, stride)

  monkeypatch.setattr(layers, 'conv_with_patch_matmul_kernel_grad', recording)
  policy('mixed_bfloat16')
  network_lib.resnet(10, 10, 28, stem='small', matmul_convs=True,
                     filters=(32, 64, 128, 256))
  # (input map, input channels, stride): the strided 3x3s into stages 3
  # and 4, and stage 4's unstrided one; not stages 1-2 nor 4x4 unstrided.
  assert sorted(set(picked)) == [(2, 256, 1), (4, 128, 2), (7, 64, 2)]


@pytest.mark.parametrize('depth,image_size', [(50, 64), (18, 28)])
def test_matmul_convs_match_native_outputs_and_gradients(depth, image_size,
                                                        policy, monkeypatch):
  # ResNet-50 at 64 px: stride-1 and stride-2 1x1 convolutions, 3x3 ones on
  # 2x2 maps with 512 channels. ResNet-18 at 28 px (small stem): stride-2
  # 3x3 convolutions from 4x4 to 2x2 and odd map sizes (7 -> 4).
  stem = 'imagenet' if depth == 50 else 'small'
  tf_keras.utils.set_random_seed(3)  # Fixed weights: a stable comparison.
  native = network_lib.resnet(depth, 10, image_size, stem=stem)
  # The other two take the native network's weights: nothing to draw.
  gradients.unfilled_kernels(monkeypatch)
  matmul = network_lib.resnet(depth, 10, image_size, stem=stem,
                              matmul_convs=True)
  assert isinstance(matmul.get_layer('stage4_block1_conv1'),
                    layers.MatmulConv2D)
  matmul.set_weights(native.get_weights())  # Same variables, same order.
  # The same network in float64: what both float32 paths approximate.
  policy('float64')
  exact = network_lib.resnet(depth, 10, image_size, stem=stem)
  policy('float32')
  assert exact.get_layer('stem_conv').kernel.dtype == tf.float64
  exact.set_weights([w.astype(np.float64) for w in native.get_weights()])
  images = tf.random.stateless_uniform([3, image_size, image_size, 3],
                                       seed=[1, 2])
  labels = tf.constant([1, 4, 7])

  # Inference-mode batch norm: batch statistics of 3 images at 2x2 px would
  # amplify rounding differences far beyond the convolutions'.
  loss_native, grads_native = loss_and_grads(native, images, labels,
                                              training=False)
  loss_matmul, grads_matmul = loss_and_grads(matmul, images, labels,
                                              training=False)
  _, grads_exact = loss_and_grads(exact, tf.cast(images, tf.float64),
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
  net = network_lib.resnet(10, 10, 28, stem='small',
                           matmul_convs=matmul_convs, filters=(16, 32, 64, 64))
  images = tf.random.stateless_uniform([2, 28, 28, 3], seed=[3, 4])
  labels = tf.constant([1, 7])
  eager_loss, eager_grads = loss_and_grads(net, images, labels)
  graph_loss, graph_grads = tf.function(loss_and_grads)(net, images, labels)
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
    ours = layers.subsample(x, stride)
    losses = [tf.reduce_sum(y * weights) for y in (ours, expected)]
  np.testing.assert_array_equal(ours.numpy(), expected.numpy())
  np.testing.assert_array_equal(tape.gradient(losses[0], x).numpy(),
                                tape.gradient(losses[1], x).numpy())
  # Traced without the map's size: the strided slice itself.
  unsized = tf.function(lambda v: layers.subsample(v, stride),
                        input_signature=[tf.TensorSpec([None, None, None,
                                                        shape[3]], dtype)])
  np.testing.assert_array_equal(unsized(x).numpy(), expected.numpy())


_SPECIAL = [0.0, -0.0, 1.5, -1.5, 3e38, -3e38, 1e-40, -1e-40, 1e-6, -1e-6,
            np.inf, -np.inf, np.nan]


@pytest.mark.parametrize('dtype', [tf.bfloat16, tf.float16, tf.float32])
def test_bitwise_relu_equals_relu_and_its_gradient(dtype):
  x = tf.cast(tf.concat([tf.constant(_SPECIAL, tf.float32),
                         tf.random.stateless_normal([1000], [3, 4]) * 10], 0),
              dtype)
  dy = tf.cast(tf.random.stateless_normal(x.shape, [5, 6]), dtype)
  results = []
  for relu in (tf.nn.relu, layers._bitwise_relu):
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
  layer = layers.ResidualRelu('bitwise')
  assert layer(negative_nan, training=True).numpy()[0] == 0
  assert np.isnan(float(layer(negative_nan, training=False)[0]))
  assert np.isnan(float(layers.ResidualRelu()(negative_nan, training=True)[0]))


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
  for add_relu in (lambda a, b: tf.nn.relu(a + b), layers._xla_add_relu):
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
  add, relu = layers.ResidualAdd('xla'), layers.ResidualRelu('xla')
  np.testing.assert_array_equal(add([a, b], training=True), [[0, 2, np.nan]])
  np.testing.assert_array_equal(relu(a, training=True), a)  # Already applied.
  np.testing.assert_array_equal(add([a, b], training=False), [[-1, 2, np.nan]])
  np.testing.assert_array_equal(relu(a, training=False), [[0, 1, np.nan]])


def _relu_batch():
  return (tf.random.stateless_normal([4, 32, 32, 3], [1, 2]) * 50,
          tf.constant([1, 4, 7, 9]))


@pytest.fixture(scope='module', name='native_bf16_resnet50')
def _native_bf16_resnet50():
  """(layer names, weights, loss, gradients) of a bf16 ResNet-50 with
  tf.nn.relu, which both fast ReLUs are held to: built once for both."""
  saved = tf_keras.mixed_precision.global_policy()
  tf_keras.mixed_precision.set_global_policy('mixed_bfloat16')
  try:
    native = network_lib.resnet(50, 10, 32)
  finally:
    tf_keras.mixed_precision.set_global_policy(saved)
  loss, grads = loss_and_grads(native, *_relu_batch())
  return ([l.name for l in native.layers], native.get_weights(), float(loss),
          [g.numpy() for g in grads])


@pytest.mark.parametrize('impl', ['bitwise', 'xla'])
def test_fast_residual_relus_train_bit_identically(impl, policy, monkeypatch,
                                                   native_bf16_resnet50):
  names, weights, loss_native, grads_native = native_bf16_resnet50
  gradients.unfilled_kernels(monkeypatch)  # It takes the native weights.
  policy('mixed_bfloat16')
  fast = network_lib.resnet(50, 10, 32, residual_relu=impl)
  policy('float32')
  assert fast.get_layer('stage1_block1_out').impl == impl
  assert [l.name for l in fast.layers] == names
  fast.set_weights(weights)
  loss_fast, grads_fast = loss_and_grads(fast, *_relu_batch())
  assert float(loss_fast) == loss_native
  assert len(grads_fast) == len(grads_native)
  for g_fast, g_native in zip(grads_fast, grads_native):
    np.testing.assert_array_equal(g_fast, g_native)


def test_blur_filter_is_a_normalised_symmetric_binomial():
  kernel = layers.blur_filter().numpy()
  np.testing.assert_allclose(kernel * 16, [[1, 2, 1], [2, 4, 2], [1, 2, 1]])
  assert kernel.sum() == pytest.approx(1.0)
  np.testing.assert_array_equal(kernel, kernel.T)
  np.testing.assert_array_equal(kernel, kernel[::-1, ::-1])
  # A constant image stays constant inside ('same' pads with zeros), each
  # channel on its own; stride 2 subsamples after blurring.
  image = tf.ones([1, 6, 6, 2]) * tf.constant([3.0, -1.0])
  blurred = layers.Blur()(image).numpy()
  np.testing.assert_allclose(blurred[0, 1:-1, 1:-1], image[0, 1:-1, 1:-1])
  assert blurred[0, 0, 0, 0] == pytest.approx(3.0 * 9 / 16)  # a corner
  strided = layers.Blur(strides=2)(image)
  assert strided.shape == (1, 3, 3, 2)
  # TensorFlow's 'same' at stride 2 on an even size pads below and right
  # only: output i is centred on input 2i + 1.
  np.testing.assert_array_equal(strided, blurred[:, 1::2, 1::2])
  # An impulse spreads into the filter itself.
  impulse = np.zeros([1, 5, 5, 1], np.float32)
  impulse[0, 2, 2, 0] = 1
  np.testing.assert_allclose(layers.Blur()(impulse)[0, 1:4, 1:4, 0], kernel)


def test_group_normalization_is_keras_without_the_mask_weighting():
  x = tf.random.normal([3, 5, 7, 16], seed=1) * 3 + 1
  ours = layers.GroupNormalization(4, epsilon=1e-3)
  keras = tf_keras.layers.GroupNormalization(4, epsilon=1e-3)
  for layer in (ours, keras):
    layer.build(x.shape)
    layer.set_weights([np.arange(16, dtype=np.float32) / 8 - 1,
                       np.linspace(-1, 1, 16).astype(np.float32)])
  np.testing.assert_allclose(ours(x), keras(x), rtol=1e-5, atol=1e-5)
  # Each group of 4 channels has mean beta and scale gamma per channel.
  unit = layers.GroupNormalization(4, epsilon=0.0)(x).numpy()
  grouped = unit.reshape(3, 5 * 7, 4, 4)
  np.testing.assert_allclose(grouped.mean(axis=(1, 3)), 0, atol=1e-5)
  np.testing.assert_allclose(grouped.std(axis=(1, 3)), 1, atol=1e-3)
  mask = tf.cast(tf.random.uniform(x.shape, seed=2) > 0.3, tf.float32)
  np.testing.assert_allclose(ours(x, mask=mask), keras(x, mask=mask),
                             rtol=1e-5, atol=1e-5)


def test_drop_path_keeps_the_expectation_and_drops_whole_examples():
  branch = tf.ones([4000, 2, 2, 3])
  with layers.drop_path_seed(tf.constant([1, 2], tf.int64)):
    dropped = layers.drop_path(branch, 0.2, index=3).numpy()
    again = layers.drop_path(branch, 0.2, index=3).numpy()
    other_block = layers.drop_path(branch, 0.2, index=4).numpy()
  per_example = dropped.reshape(4000, -1)
  # Every example keeps or drops its whole branch, survivors x 1/0.8.
  assert set(np.unique(per_example)) == {0.0, 1.25}
  assert np.all(per_example.min(1) == per_example.max(1))
  assert abs(per_example.mean() - 1.0) < 0.05  # the expectation: the branch
  np.testing.assert_array_equal(dropped, again)  # a function of the seed
  assert np.any(dropped != other_block)  # each block draws its own
