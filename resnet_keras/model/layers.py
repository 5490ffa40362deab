"""The ResNets' own Keras layers (network.py builds with them) and the ops
they run: `MatmulConv2D` (convolutions on matmuls where those win),
`ResidualAdd` and `ResidualRelu` (the residual add and the ReLU after it,
fused or bitwise in training; drop path), `Blur` (--blurpool's
anti-aliasing) and `GroupNormalization` (Keras's, its moments plain). Each
has the variables of the Keras layer it extends (Blur has none), so a
checkpoint does not depend on which implementation a run used.
"""

import contextlib
import threading

import tensorflow as tf
import tf_keras


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


class MatmulConv2D(tf_keras.layers.Conv2D):
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


class ResidualAdd(tf_keras.layers.Add):
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


class ResidualRelu(tf_keras.layers.Layer):
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



# The binomial low-pass filter [1, 2, 1] x [1, 2, 1] / 16 of BlurPool
# (Zhang, "Making Convolutional Networks Shift-Invariant Again", 2019).
BLUR_TAPS = (1.0, 2.0, 1.0)


def blur_filter() -> tf.Tensor:
  """The 3x3 blur: an outer product of the binomial taps, summing to 1."""
  taps = tf.constant(BLUR_TAPS)
  kernel = taps[:, None] * taps[None, :]
  return kernel / tf.reduce_sum(kernel)


class Blur(tf_keras.layers.Layer):
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


class GroupNormalization(tf_keras.layers.GroupNormalization):
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
