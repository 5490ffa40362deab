"""ResNet v1.5 classifiers (Keras functional API, tf_keras).

v1.5 puts the stride of a downsampling bottleneck on its 3x3 convolution (not
the first 1x1), which is what the Model Garden and MLPerf train. Batch norm
uses momentum 0.9 and epsilon 1e-5 (optionally synchronised across replicas);
group norm the same epsilon. The softmax runs in float32 under mixed
precision so the loss never sees bf16/fp16 probabilities.

Two models exist per run: the *network* takes normalised float images (used
for export, where the serving signature normalises), and the *training model*
wraps it with the input the data pipeline delivers (uint8 images get cast and
normalised on the device as the first layer).
"""

import contextlib
import math
import threading
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

from resnet_keras import hardware
from resnet_keras.config import STAGE_FILTERS, RunConfig
from resnet_keras.data import datasets
from resnet_keras.data.preprocessing import normalize_images
from common.errors import UsageError
from resnet_keras.optimizers import l2_regularizer

layers = tf_keras.layers

# Blocks per stage, and whether the depth uses bottleneck blocks.
_STAGES = {
    10: ((1, 1, 1, 1), False),
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True),
    152: ((3, 8, 36, 3), True),
}
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def kernel_grad_by_patches(out_pixels: int, in_channels: int, stride: int,
                           dtype: str) -> bool:
  """Whether a 3x3 convolution's weight gradient should be im2col patches x
  one matmul rather than oneDNN's weight-gradient kernel.

  Where the patches win: maps of 7x7 or less with at least 256 input
  channels (ResNet-50's last stage; benchmarks/levers.py, measured with
  AMX); 2x2 maps with at least 64 (1.2-2.6x in bf16 and in fp32 on AVX2
  kernels, batch 256); in bf16, strided convolutions to 4x4 maps (1.2-1.8x;
  0.65-0.9x in fp32). `python -m benchmarks.kernel_grad` prints the grid.
  """
  if out_pixels <= 4:
    return in_channels >= 64
  if dtype == 'bfloat16' and stride > 1 and out_pixels <= 16:
    return True
  return in_channels >= 256 and out_pixels <= 49


def conv_with_patch_matmul_kernel_grad(inputs, kernel, strides):
  """Conv2D ('same') whose kernel gradient is im2col patches x matmul."""

  @tf.custom_gradient
  def conv(x, k):

    def grad(dy):
      kh, kw, ci, co = k.shape
      dx = tf.nn.conv2d_transpose(dy, k, tf.shape(x), strides, 'SAME')
      patches = tf.image.extract_patches(x, [1, kh, kw, 1],
                                         [1, strides, strides, 1],
                                         [1, 1, 1, 1], 'SAME')
      dk = tf.matmul(tf.reshape(patches, [-1, kh * kw * ci]),
                     tf.reshape(dy, [-1, co]), transpose_a=True)
      return dx, tf.reshape(dk, k.shape)

    return tf.nn.conv2d(x, k, strides, 'SAME'), grad

  # The kernel read (and cast, under a mixed policy) here, outside the
  # custom gradient: called eagerly, tf.custom_gradient watches the
  # variables its function reads and refuses a grad without a `variables`
  # argument, and a mixed policy's AutoCastVariable is not the variable it
  # wraps, so it counts as read even when passed as `k`. The gradient still
  # reaches the variable, through the read.
  return conv(inputs, tf.convert_to_tensor(kernel))


def subsample(x, stride: int):
  """x[:, ::stride, ::stride, :] (NHWC), as a reshape that keeps the first
  pixel of each stride x stride block, and a zero pad as its gradient.

  Same values and gradients as the strided slice, which TensorFlow's CPU
  kernels run slowly in both directions (StridedSlice and StridedSliceGrad
  were a tenth of fashion_mnist_94's bf16 op time; its img/s is 1.11x
  without them: benchmarks/HISTORY.md). Needs the map's size when traced;
  without it, the strided slice.
  """
  _, height, width, channels = x.shape
  if height is None or width is None:
    return x[:, ::stride, ::stride, :]
  # 'same' 1x1 strided outputs take ceil(size / stride) pixels: pad to a
  # multiple of the stride (the padding is never kept).
  pad_h, pad_w = -height % stride, -width % stride
  rows, cols = (height + pad_h) // stride, (width + pad_w) // stride
  padding = [[0, 0], [0, pad_h], [0, pad_w], [0, 0]]

  @tf.custom_gradient
  def keep_first(x):
    padded = tf.pad(x, padding) if pad_h or pad_w else x
    blocks = tf.reshape(padded, [-1, rows, stride, cols, stride * channels])

    def grad(dy):
      spread = tf.pad(dy[:, :, None], [[0, 0], [0, 0], [0, stride - 1], [0, 0],
                                       [0, (stride - 1) * channels]])
      spread = tf.reshape(spread, tf.shape(padded))
      return spread[:, :height, :width, :] if pad_h or pad_w else spread

    return blocks[:, :, 0, :, :channels], grad

  return keep_first(x)


class MatmulConv2D(layers.Conv2D):
  """Conv2D ('same', square strides) that runs on matmuls where they win.

  Same kernel variable and same results as Conv2D. 1x1 convolutions are one
  matmul over all pixels (strides subsample first, which is what a 1x1
  'same' convolution does); 3x3 convolutions on small maps
  (kernel_grad_by_patches) keep the native forward pass and input gradient
  but compute the kernel gradient as patches x matmul. Why: there oneDNN's
  matmul is much faster than its convolution weight gradients.
  """

  def convolution_op(self, inputs, kernel):
    stride = self.strides[0]
    if self.kernel_size == (1, 1):
      if stride != 1:
        inputs = subsample(inputs, stride)
      shape = tf.shape(inputs)
      pixels = tf.reshape(inputs, [-1, kernel.shape[2]])
      outputs = tf.matmul(pixels, tf.reshape(kernel, kernel.shape[2:]))
      return tf.reshape(outputs, tf.concat([shape[:-1], [self.filters]], 0))
    _, height, width, channels = inputs.shape
    if height is None or width is None:  # Sizes known only when run.
      return super().convolution_op(inputs, kernel)
    out_pixels = -(-height // stride) * -(-width // stride)
    if kernel_grad_by_patches(out_pixels, channels, stride,
                              self.compute_dtype):
      return conv_with_patch_matmul_kernel_grad(inputs, kernel, stride)
    return super().convolution_op(inputs, kernel)


@tf.custom_gradient
def _bitwise_relu(x):
  """ReLU as max(bits, 0) on the same-width signed-integer view of `x`.

  Every negative float has its sign bit set, so its integer view is
  negative, and non-negative floats keep their order as integers: the result
  equals tf.nn.relu(x) for every value except a negative NaN, which becomes 0
  (see ResidualRelu), and a positive subnormal, which passes through where
  tf.nn.relu flushes it (TensorFlow's CPU kernels read it as 0 either way).
  Why: TensorFlow's bf16 ReLU on CPUs is scalar code, 3-4x slower than this
  integer max. The gradient is tf.nn.relu's.
  """
  int_type = {2: tf.int16, 4: tf.int32}[x.dtype.size]
  y = tf.bitcast(tf.maximum(tf.bitcast(x, int_type), 0), x.dtype)
  return y, lambda dy: tf.raw_ops.ReluGrad(gradients=dy, features=y)


@tf.function(jit_compile=True)
def _add_relu_kernel(a, b):
  return tf.nn.relu(a + b)


@tf.function(jit_compile=True)
def _relu_grad_kernel(dy, y):
  # ReluGrad's result, dy * (y > 0), where a NaN dy stays NaN. Written as a
  # select: XLA turns the multiply by a 0/1 mask into one that returns 0.
  return tf.where(y > 0, dy, dy * 0)


@tf.custom_gradient
def _xla_add_relu(a, b):
  """relu(a + b) as one XLA-compiled kernel, and its gradient as another.

  Why: on CPUs TensorFlow runs a bf16 add and a ReLU as two Eigen passes
  over memory, each slower per element than fp32; XLA fuses them into one
  vectorised loop (16x56x56x256 bf16: 4.9 ms vs 7.6-9.1 ms for the add and
  the bitwise ReLU). Same values as tf.nn.relu(a + b), NaN included.
  """
  y = _add_relu_kernel(a, b)

  def grad(dy):
    dx = _relu_grad_kernel(dy, y)
    return dx, dx

  return y, grad


class ResidualAdd(layers.Add):
  """The residual add [branch, shortcut]; with impl 'xla', in training, also
  the ReLU after it; with `drop_rate`, in training, drop path on the branch.

  The fused add + ReLU lives in this layer and the ResidualRelu after it
  passes its input through, and drop path lives here too rather than in a
  layer of its own: the model keeps the same layers whatever trains it, so
  checkpoints move freely between implementations and drop path rates (a
  functional model's checkpoint numbers its layers).
  """

  def __init__(self, impl: str = 'native', drop_rate: float = 0.0,
               index: int = 0, **kwargs):
    super().__init__(**kwargs)
    self.impl = impl
    self.drop_rate = drop_rate
    self.index = index

  # Keras would convert this with AutoGraph each time a model is built (0.2
  # s); its branches are on Python values (trainer.create_train_loop_fn).
  @tf.autograph.experimental.do_not_convert
  def call(self, inputs, training=None):
    if training and self.drop_rate:
      inputs = [drop_path(inputs[0], self.drop_rate, self.index), inputs[1]]
    if self.impl == 'xla' and training:
      return _xla_add_relu(*inputs)
    return super().call(inputs)

  def get_config(self):
    return {**super().get_config(), 'impl': self.impl,
            'drop_rate': self.drop_rate, 'index': self.index}


class ResidualRelu(layers.Layer):
  """The ReLU after a residual add; how it trains is `impl`.

  'native' is tf.nn.relu. 'bitwise' is `_bitwise_relu`; only the ReLUs after
  the adds can use it: the others follow a batch norm, which oneDNN fuses
  with its ReLU (a bitwise one would undo that), and in training a negative
  NaN becomes 0, which is why the trainer also stops on non-finite weights
  (guards.LoopGuard). 'xla': the ResidualAdd before it already applied the
  ReLU (`_xla_add_relu`), so training passes the input through. Evaluation,
  prediction and export always run the add and tf.nn.relu.
  """

  def __init__(self, impl: str = 'native', **kwargs):
    super().__init__(**kwargs)
    self.impl = impl

  @tf.autograph.experimental.do_not_convert  # As ResidualAdd.call.
  def call(self, inputs, training=None):
    if training and self.impl == 'bitwise':
      return _bitwise_relu(inputs)
    if training and self.impl == 'xla':
      return inputs
    return tf.nn.relu(inputs)

  def get_config(self):
    return {**super().get_config(), 'impl': self.impl}


class _DrawSeed(threading.local):
  """The seed of the training call being traced (drop_path_seed)."""
  value = None


_DRAW_SEED = _DrawSeed()


@contextlib.contextmanager
def drop_path_seed(seed):
  """Within: drop_path draws its masks from `seed` ([2] int64), each block
  folding in its own index. The objective opens it around a training
  step's forward and backward pass with a seed of (run seed, step,
  micro-batch, replica), so a resumed seeded run drops exactly the branches
  the uninterrupted one did (stateful random ops restart their streams)."""
  previous, _DRAW_SEED.value = _DRAW_SEED.value, seed
  try:
    yield
  finally:
    _DRAW_SEED.value = previous


def drop_path(branch, rate: float, index: int):
  """Stochastic depth (Huang et al., 2016; timm's drop_path) of a residual
  branch in training: each example's branch zeroed with probability `rate`,
  the survivors scaled by 1 / (1 - rate), so its expectation is the
  branch. `index` keys this block's draws within drop_path_seed's."""
  keep = 1.0 - rate
  shape = tf.concat([tf.shape(branch)[:1],
                     tf.ones([branch.shape.rank - 1], tf.int32)], 0)
  if _DRAW_SEED.value is None:  # Outside a seeded training step.
    draws = tf.random.uniform(shape)
  else:
    draws = tf.random.stateless_uniform(
        shape, tf.random.experimental.stateless_fold_in(_DRAW_SEED.value,
                                                        index))
  mask = tf.cast(draws < keep, branch.dtype) / tf.cast(keep, branch.dtype)
  return branch * mask


def drop_path_rates(num_blocks: int, rate: float):
  """Each block's rate: linear from 0 at the first to `rate` at the last
  (timm's ResNet: rate * index / (blocks - 1))."""
  if num_blocks == 1:
    return [rate]
  return [rate * i / (num_blocks - 1) for i in range(num_blocks)]


def _conv(filters, kernel_size, strides, name, regularizer,
          use_matmul=False):
  return (MatmulConv2D if use_matmul else layers.Conv2D)(
      filters, kernel_size, strides=strides, padding='same', use_bias=False,
      kernel_initializer='he_normal', kernel_regularizer=regularizer,
      name=name)


# The binomial low-pass filter [1, 2, 1] x [1, 2, 1] / 16 of BlurPool
# (Zhang, "Making Convolutional Networks Shift-Invariant Again", 2019).
BLUR_TAPS = (1.0, 2.0, 1.0)
# FFCV's rule: strided convolutions of fewer input channels (the stem's on
# RGB) keep their aliasing; a blur there would only smear the pixels.
BLUR_MIN_CHANNELS = 16


def blur_filter() -> tf.Tensor:
  """The 3x3 blur: an outer product of the binomial taps, summing to 1."""
  taps = tf.constant(BLUR_TAPS)
  kernel = taps[:, None] * taps[None, :]
  return kernel / tf.reduce_sum(kernel)


class Blur(layers.Layer):
  """Each channel low-pass filtered by `blur_filter` ('same', zeros around,
  as FFCV), then subsampled by `strides`: the anti-aliasing before a
  subsampling that --blurpool adds. No weights: checkpoints are unchanged."""

  def __init__(self, strides: int = 1, **kwargs):
    super().__init__(**kwargs)
    self.strides = strides

  def call(self, inputs):
    kernel = tf.tile(blur_filter()[:, :, None, None],
                     [1, 1, inputs.shape[-1], 1])
    return tf.nn.depthwise_conv2d(inputs, tf.cast(kernel, inputs.dtype),
                                  [1, self.strides, self.strides, 1], 'SAME')

  def get_config(self):
    return {**super().get_config(), 'strides': self.strides}


class GroupNormalization(layers.GroupNormalization):
  """Keras's group norm, its moments plain rather than mask-weighted.

  Without a mask, Keras weights the moments by a tensor of ones: a multiply
  per element for nothing, and a graph the TFLite converter folds at batch
  1 (its BROADCAST_TO then refuses any other batch size). Same variables,
  same results. (Keras 2.20's grouping and weight reshapes, reused.)
  """

  def call(self, inputs, mask=None):
    if mask is not None:
      return super().call(inputs, mask)
    grouped = self._reshape_into_groups(inputs)
    # Over each group's positions and channels: all but batch and group
    # (the group axis is inserted before the channel axis).
    axes = list(range(1, grouped.shape.rank))
    axes.pop(self.axis - 1)
    mean, variance = tf.nn.moments(grouped, axes, keepdims=True)
    gamma, beta = self._get_reshaped_weights(tf.shape(inputs))
    normalised = tf.nn.batch_normalization(grouped, mean, variance, beta,
                                           gamma, self.epsilon)
    return tf.reshape(normalised, tf.shape(inputs))


# (name, zero_init) -> a new layer; zero_init: its scale (gamma) starts at 0.
NormFactory = Callable[..., layers.Layer]


def norm_factory(norm: str = 'batch', groups: int = 32,
                 sync_batch_norm: bool = False,
                 hvd: Any = None) -> NormFactory:
  """The normalisation layer after each convolution.

  Args:
    norm: 'batch' or 'group'.
    groups: group norm's channel groups (must divide every channel count).
    sync_batch_norm: batch statistics over the global batch: all-reduced
      across tf.distribute replicas (no effect outside a strategy), or across
      Horovod workers when `hvd` is given. Same variables either way.
    hvd: the horovod.tensorflow module under Horovod, else None.
  """
  if norm == 'group':
    # float32 even under mixed precision, like batch norm's statistics:
    # per-image moments summed in bf16 lose too much.
    return lambda name, zero_init=False: GroupNormalization(
        groups, epsilon=BN_EPSILON, dtype='float32', name=name,
        gamma_initializer=_gamma(zero_init))
  if sync_batch_norm and hvd is not None:
    if not hasattr(hvd, 'SyncBatchNormalization'):
      raise UsageError('--sync_batch_norm with --use_horovod needs Horovod '
                       '>= 0.21 (hvd.SyncBatchNormalization); upgrade it, or '
                       'drop --sync_batch_norm')
    return lambda name, zero_init=False: hvd.SyncBatchNormalization(
        momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name,
        gamma_initializer=_gamma(zero_init))
  return lambda name, zero_init=False: layers.BatchNormalization(
      momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
      synchronized=sync_batch_norm, name=name,
      gamma_initializer=_gamma(zero_init))


def _gamma(zero_init: bool) -> str:
  return 'zeros' if zero_init else 'ones'


def _blurred(x, strides, name, blurpool):
  """`x` blurred before a convolution of `strides` (--blurpool), else `x`."""
  if blurpool and strides != 1 and x.shape[-1] >= BLUR_MIN_CHANNELS:
    return Blur(name=name)(x)
  return x


def _block(x, filters, strides, bottleneck, name, conv, norm, residual_relu,
           zero_init_residual=False, blurpool=False, drop=(0.0, 0)):
  """One residual block; projects the shortcut when the shape changes.
  With `zero_init_residual` the branch's last norm starts at gamma 0, so
  the block starts as relu(shortcut). With `blurpool` the inputs of its
  strided convolutions are blurred first (FFCV's BlurPool). `drop`: the
  branch's drop path (rate, block index)."""
  out_filters = filters * 4 if bottleneck else filters
  shortcut = x
  blurred_input = _blurred(x, strides, name + '_blur', blurpool)
  if strides != 1 or x.shape[-1] != out_filters:
    shortcut = conv(out_filters, 1, strides, name + '_proj')(blurred_input)
    shortcut = norm(name + '_proj_bn')(shortcut)
  if bottleneck:
    convs = ((filters, 1, 1), (filters, 3, strides), (out_filters, 1, 1))
  else:
    convs = ((filters, 3, strides), (filters, 3, 1))
  for i, (f, k, s) in enumerate(convs):
    last = i == len(convs) - 1
    if s != 1:  # The block's input is blurred once for both its readers.
      x = blurred_input if i == 0 else _blurred(x, s, f'{name}_blur{i + 1}',
                                                blurpool)
    x = conv(f, k, s, f'{name}_conv{i + 1}')(x)
    x = norm(f'{name}_bn{i + 1}', zero_init=last and zero_init_residual)(x)
    if not last:
      x = layers.Activation('relu', name=f'{name}_relu{i + 1}')(x)
  x = ResidualAdd(residual_relu, *drop, name=name + '_add')([x, shortcut])
  return ResidualRelu(residual_relu, name=name + '_out')(x)


# The classification head's only layer with weights; everything before it is
# the backbone that --pretrained_checkpoint transfers.
HEAD_LAYER = 'fc'


def _classifier_head(features, num_classes, regularizer):
  logits = layers.Dense(
      num_classes,
      kernel_initializer=tf_keras.initializers.RandomNormal(stddev=0.01),
      kernel_regularizer=regularizer, name=HEAD_LAYER)(features)
  return layers.Activation('softmax', dtype='float32', name='probs')(logits)


# Stem -> (conv kernel, conv stride, max pool?). Small images lose too much
# detail to the ImageNet stem's 4x reduction (28 px -> 7x7 before stage 1).
_STEMS = {'imagenet': (7, 2, True), 'small': (3, 1, True),
          'cifar': (3, 1, False)}


# The stem's convolution: --stem_init=pca starts it from image patches.
STEM_CONV = 'stem_conv'
# Patches whose covariance --stem_init=pca estimates (dimensions <= 147).
PCA_PATCHES = 100_000


def pca_image_count(image_size: int, kernel_size: int) -> int:
  """Images of `image_size` that hold PCA_PATCHES non-overlapping patches."""
  per_image = (image_size // kernel_size) ** 2
  return max(1, -(-PCA_PATCHES // per_image))


def stem_patches(images: tf.Tensor, kernel_size: int) -> np.ndarray:
  """Non-overlapping `kernel_size` patches of normalised `images` [N, H, W,
  C] as rows [P, k * k * C], ordered as a Conv2D kernel's first three axes
  flattened."""
  k = kernel_size
  patches = tf.image.extract_patches(
      images, sizes=[1, k, k, 1], strides=[1, k, k, 1],
      rates=[1, 1, 1, 1], padding='VALID')
  return patches.numpy().reshape(-1, patches.shape[-1]).astype(np.float64)


def pca_stem_kernel(patches: np.ndarray, kernel: np.ndarray
                    ) -> Tuple[np.ndarray, int, float]:
  """`kernel` [k, k, C, F] with its first filters replaced by the principal
  directions of `patches` [P, k * k * C], in +/- pairs, largest variance
  first, each scaled to the root-mean-square norm of `kernel`'s filters.

  A random stem sees mostly the local brightness, the patches' dominant
  direction, in every filter: its channels start as near-copies, and batch
  norm cannot decorrelate them. The principal directions, each normalised
  by the batch norm after it, make the stem's output start white over the
  directions it keeps (airbench's whitening layer, here trainable). Only
  directions of non-negligible variance are used (grey images in RGB have
  rank k * k) and at most F // 2; the other filters keep their values.
  Returns (kernel, directions used, fraction of the variance they hold).
  """
  variances, directions = np.linalg.eigh(np.cov(patches, rowvar=False))
  order = np.argsort(variances)[::-1]
  variances, directions = variances[order], directions[:, order]
  rank = int(np.sum(variances > 1e-6 * variances[0]))
  used = min(rank, kernel.shape[-1] // 2)
  flat = kernel.reshape(-1, kernel.shape[-1]).copy()
  norm = np.sqrt(np.mean(np.sum(flat ** 2, axis=0)))
  for i in range(used):
    flat[:, 2 * i] = directions[:, i] * norm
    flat[:, 2 * i + 1] = -directions[:, i] * norm
  held = float(np.sum(variances[:used]) / np.sum(variances))
  return flat.reshape(kernel.shape), used, held


def init_stem_from_images(network: tf_keras.Model, images: tf.Tensor
                          ) -> Tuple[int, int, float]:
  """--stem_init=pca on a built ResNet from normalised `images`: returns
  (directions used, the stem's filters, fraction of the patch variance)."""
  conv = network.get_layer(STEM_CONV)
  kernel_size = conv.kernel.shape[0]
  kernel, used, held = pca_stem_kernel(stem_patches(images, kernel_size),
                                       conv.kernel.numpy())
  conv.kernel.assign(kernel)
  return used, kernel.shape[-1], held


class StagewiseRecompute(tf_keras.Model):
  """A functional ResNet that recomputes each stage in the backward pass.

  It is the plain functional model (same layers, variables, names and
  checkpoints, so a run can switch --enable_recompute on resume); only a
  training call differs: the stem, each residual stage and the head run as
  sub-models sharing those layers, each stage under tf.recompute_grad, so the
  forward pass keeps only stage inputs and the backward pass recomputes a
  stage's activations before differentiating it. The layers exist before
  anything is wrapped, so tf.recompute_grad only reads variables.

  Batch norm inside a stage runs twice per step (forward and recomputation)
  and so updates its moving averages twice with the same batch statistics;
  its momentum becomes sqrt(momentum), so the two updates equal one of the
  plain model's.
  """

  def __init__(self, inputs, outputs, boundaries: Sequence[tf.Tensor],
               name: str):
    """`boundaries`: the stem's output, then each stage's (Keras tensors)."""
    super().__init__(inputs, outputs, name=name)
    bounds = [self.input, *boundaries, self.output]
    pieces = [tf_keras.Model(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    for stage in pieces[1:-1]:
      for layer in stage.layers:
        if isinstance(layer, layers.BatchNormalization):
          layer.momentum = math.sqrt(layer.momentum)
    # Held in a closure: as attributes they would be tracked, adding their
    # shared layers to checkpoints a second time under new paths.
    self._pieces = lambda: pieces

  def call(self, inputs, training=None, mask=None):
    if not training:
      return super().call(inputs, training=training, mask=mask)
    stem, *stages, head = self._pieces()
    x = stem(inputs, training=True)
    for stage in stages:
      x = tf.recompute_grad(lambda t, s=stage: s(t, training=True))(x)
    return head(x, training=True)


def resnet(depth: int, num_classes: int, image_size: Optional[int],
           weight_decay: float = 0.0, stem: str = 'imagenet',
           matmul_convs: bool = False, residual_relu: str = 'native',
           norm: Optional[NormFactory] = None,
           recompute: bool = False,
           filters: Sequence[int] = STAGE_FILTERS,
           zero_init_residual: bool = False,
           blurpool: bool = False,
           drop_path_rate: float = 0.0) -> tf_keras.Model:
  """ResNet v1.5 of `depth` on normalised float images.

  Args:
    depth: 10, 18, 34, 50, 101 or 152.
    num_classes: units of the output layer.
    image_size: height and width of the input (None: any).
    weight_decay: if > 0, per-layer L2 regularisers with the strength defined
      in `resnet_keras.optimizers` (0: decay is applied elsewhere, or not).
    stem: 'imagenet', 'small' or 'cifar' (see `_STEMS`).
    matmul_convs: run convolutions on matmuls where that is faster (same
      variables and results; see `MatmulConv2D`).
    residual_relu: how the ReLUs after the residual adds train: 'native',
      'bitwise' or 'xla' (faster for bf16 on CPUs; see `ResidualRelu`).
    norm: makes the normalisation layers (default: batch norm; see
      `norm_factory`).
    recompute: recompute each stage's activations in the backward pass (a
      `StagewiseRecompute`).
    filters: output channels of the stem and of each stage's basic blocks (a
      bottleneck's inner ones; 4x leave it): the standard widths, or
      `RunConfig.stage_filters` scaled by --width_multiplier.
    zero_init_residual: each residual branch's last norm starts at gamma 0
      (Goyal et al., 2017): every block starts as its shortcut.
    blurpool: anti-aliased downsampling (`Blur`): the inputs of strided
      convolutions of 16 or more channels are blurred first, and the stem's
      max pooling becomes a stride-1 max and a blurred subsampling.
    drop_path_rate: stochastic depth of the last block (`drop_path_rates`),
      in the residual adds: the same layers and checkpoints at any rate.
  """
  norm = norm or norm_factory()
  blocks, bottleneck = _STAGES[depth]
  kernel, stride, pool = _STEMS[stem]
  regularizer = l2_regularizer(weight_decay)
  conv = lambda f, k, s, name: _conv(f, k, s, name, regularizer,
                                     matmul_convs)
  inputs = layers.Input((image_size, image_size, 3), name='images')
  x = conv(filters[0], kernel, stride, STEM_CONV)(inputs)
  x = norm('stem_bn')(x)
  x = layers.Activation('relu', name='stem_relu')(x)
  if pool and blurpool:
    x = layers.MaxPooling2D(3, strides=1, padding='same', name='stem_pool')(x)
    x = Blur(strides=2, name='stem_pool_blur')(x)
  elif pool:
    x = layers.MaxPooling2D(3, strides=2, padding='same', name='stem_pool')(x)
  boundaries = [x]
  drops = iter((rate, index) for index, rate in enumerate(
      drop_path_rates(sum(blocks), drop_path_rate)))
  for stage, (num_blocks, stage_filters) in enumerate(zip(blocks, filters)):
    for b in range(num_blocks):
      strides = 2 if stage > 0 and b == 0 else 1
      x = _block(x, stage_filters, strides, bottleneck,
                 f'stage{stage + 1}_block{b + 1}', conv, norm, residual_relu,
                 zero_init_residual, blurpool, next(drops))
    boundaries.append(x)
  x = layers.GlobalAveragePooling2D(name='avg_pool')(x)
  outputs = _classifier_head(x, num_classes, regularizer)
  if recompute:
    return StagewiseRecompute(inputs, outputs, boundaries,
                              name=f'resnet{depth}')
  return tf_keras.Model(inputs, outputs, name=f'resnet{depth}')


def keras_application(name: str, num_classes: int,
                      image_size: Optional[int]) -> tf_keras.Model:
  """A keras.applications ResNet backbone with this project's head.

  The backbone is built without its top so the head matches ours: one unit
  per class and a float32 softmax. Weight decay for these models comes from
  the single L2 term (same gradient as regularisers; see optimizers.py).
  """
  backbone = getattr(tf_keras.applications, name)(
      include_top=False, weights=None, pooling='avg',
      input_shape=(image_size, image_size, 3))
  return tf_keras.Model(
      backbone.inputs, _classifier_head(backbone.output, num_classes, None),
      name=name.lower())


def backbone_layers(network: tf_keras.Model):
  """The layers with weights before the classification head."""
  return [l for l in network.layers if l.weights and l.name != HEAD_LAYER]


def freeze_backbone(network: tf_keras.Model) -> None:
  """Leaves only the head trainable.

  A non-trainable BatchNormalization runs in inference mode in tf_keras even
  when called with training=True: it normalises with, and keeps, the
  pretrained moving statistics, which the frozen weights after it expect.
  """
  for layer in backbone_layers(network):
    layer.trainable = False


def build_network(cfg: RunConfig, num_classes: int, use_regularizers: bool,
                  machine: Optional[hardware.Machine] = None,
                  hvd: Any = None) -> tf_keras.Model:
  """The network the flags ask for (inputs: normalised float images).

  `machine` decides the auto kernels (default: this one). `hvd`: the
  horovod.tensorflow module under Horovod (its synchronised batch norm),
  else None.
  """
  machine = machine or hardware.detect()
  if cfg.keras_applications_model:
    network = keras_application(cfg.keras_applications_model, num_classes,
                                cfg.input_size)
  else:
    norm = norm_factory(cfg.norm, cfg.groups, cfg.sync_batch_norm, hvd)
    network = resnet(cfg.resnet_depth, num_classes, cfg.input_size,
                     weight_decay=cfg.weight_decay if use_regularizers else 0.0,
                     stem=cfg.stem,
                     matmul_convs=hardware.uses_matmul_convs(
                         cfg.conv_impl, cfg.dtype, machine),
                     residual_relu=hardware.residual_relu(
                         cfg.relu_impl, cfg.dtype, machine), norm=norm,
                     recompute=cfg.enable_recompute,
                     filters=cfg.stage_filters,
                     zero_init_residual=cfg.zero_init_residual,
                     blurpool=cfg.blurpool,
                     drop_path_rate=cfg.drop_path_rate)
  # Also when validate or average rebuild the run: its checkpoints hold
  # optimizer slots for the trainable variables only.
  if cfg.freeze_backbone:
    freeze_backbone(network)
  return network


def build_training_model(network: tf_keras.Model, image_size: Optional[int],
                         input_dtype: tf.DType,
                         normalize_on_device: bool,
                         compute_dtype: Optional[str] = None) -> tf_keras.Model:
  """Wraps `network` with the input the data pipeline delivers (of
  `image_size`; None: any)."""
  inputs = layers.Input((image_size, image_size, 3), dtype=input_dtype,
                        name='pipeline_images')
  x = inputs
  if normalize_on_device:
    x = layers.Lambda(
        lambda t: normalize_images(t, compute_dtype or tf.float32),
        name='normalize_on_device')(x)
  return tf_keras.Model(inputs, network(x), name='training_model')


def _for_training(cfg: RunConfig, network: tf_keras.Model) -> tf_keras.Model:
  """`network` wrapped for the run's input, under the current policy."""
  return build_training_model(
      network, cfg.input_size, datasets.loader_dtype(cfg),
      normalize_on_device=cfg.data_loader_image_type == 'uint8',
      compute_dtype=tf_keras.mixed_precision.global_policy().compute_dtype)


def build_models(cfg: RunConfig, num_classes: int, use_regularizers: bool,
                 machine: Optional[hardware.Machine] = None, hvd: Any = None
                 ) -> Tuple[tf_keras.Model, tf_keras.Model]:
  """(network, training model) of a run, under the current precision policy.

  Training and `resnet_keras.validate` both build them here, so a
  checkpoint's object graph is the same in both.
  """
  network = build_network(cfg, num_classes, use_regularizers, machine, hvd)
  return network, _for_training(cfg, network)


def logits_view(network: tf_keras.Model) -> tf_keras.Model:
  """`network` up to its head's logits, before the softmax: the same layers
  and variables, so a loss on the logits trains the network itself. A
  functional view: it bypasses StagewiseRecompute's call (config.py refuses
  --loss=bce with --enable_recompute)."""
  return tf_keras.Model(network.inputs, network.get_layer(HEAD_LAYER).output,
                        name=f'{network.name}_logits')


def build_logits_model(cfg: RunConfig,
                       network: tf_keras.Model) -> tf_keras.Model:
  """The training model's twin that outputs the logits (--loss=bce): what
  the objective trains on, while the training model, evaluation and the
  export keep the softmax probabilities. Nothing tracks it: checkpoints
  hold the training model's variables, which are its own."""
  return _for_training(cfg, logits_view(network))


def count_trainable_parameters(model: tf_keras.Model) -> int:
  return int(sum(tf.size(v).numpy() for v in model.trainable_variables))
