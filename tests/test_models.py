"""Model structure: parameter counts, precision of the output, uint8 input."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras import models
from resnet_keras.config import RunConfig
from resnet_keras.data.preprocessing import normalize_images

# Trainable parameters with 1000 classes (torchvision's published counts).
EXPECTED_PARAMS = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032,
                   101: 44_549_160, 152: 60_192_808}


@pytest.mark.parametrize('depth', sorted(EXPECTED_PARAMS))
def test_parameter_counts(depth):
  model = models.resnet(depth, 1000, 224)
  assert models.count_trainable_parameters(model) == EXPECTED_PARAMS[depth]


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


def test_bf16_policy_keeps_float32_softmax_and_variables():
  tf_keras.mixed_precision.set_global_policy('mixed_bfloat16')
  try:
    model = models.resnet(18, 10, 32)
    out = model(tf.zeros([2, 32, 32, 3]))
    assert out.dtype == tf.float32
    assert all(v.dtype == tf.float32 for v in model.variables)
    assert model.get_layer('stem_conv').compute_dtype == 'bfloat16'
  finally:
    tf_keras.mixed_precision.set_global_policy('float32')


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


def test_keras_applications_backbone_gets_our_head():
  cfg = RunConfig(keras_applications_model='ResNet50V2', image_size=32)
  model = models.build_network(cfg, 10, use_regularizers=False)
  assert model.output_shape == (None, 10)
  assert model.layers[-1].dtype_policy.compute_dtype == 'float32'


@pytest.mark.parametrize('depth,image_size', [(50, 64), (18, 28)])
def test_matmul_convs_match_native_outputs_and_gradients(depth, image_size):
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
  images = tf.random.stateless_uniform([3, image_size, image_size, 3],
                                       seed=[1, 2])
  labels = tf.constant([1, 4, 7])

  def loss_and_grads(model):
    # Inference-mode batch norm: batch statistics of 3 images at 2x2 px
    # would amplify rounding differences far beyond the convolutions'.
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf_keras.losses.sparse_categorical_crossentropy(
          labels, model(images, training=False)))
    return loss, tape.gradient(loss, model.trainable_variables)

  loss_native, grads_native = loss_and_grads(native)
  loss_matmul, grads_matmul = loss_and_grads(matmul)
  np.testing.assert_allclose(loss_matmul, loss_native, rtol=1e-4)
  for g_matmul, g_native in zip(grads_matmul, grads_native):
    # Summation order differs (matmul vs convolution kernels): compare
    # relative to each gradient's scale.
    np.testing.assert_allclose(g_matmul, g_native, rtol=1e-3,
                               atol=1e-3 * float(tf.reduce_max(abs(g_native))))


@pytest.mark.parametrize('setting,dtype,has_gpu,expected', [
    ('auto', 'bf16', False, True), ('auto', 'fp32', False, False),
    ('auto', 'bf16', True, False), ('matmul', 'fp32', True, True),
    ('native', 'bf16', False, False)])
def test_conv_impl_setting(setting, dtype, has_gpu, expected):
  cfg = RunConfig(conv_impl=setting, dtype=dtype)
  assert cfg.uses_matmul_convs(has_gpu) is expected
