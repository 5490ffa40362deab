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

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras

from resnet_keras.config import hardware
from resnet_keras.config.channels import STAGE_FILTERS
from resnet_keras.config import RunConfig
from common.errors import UsageError
from resnet_keras.model.layers import (Blur, GroupNormalization, MatmulConv2D,
                                       ResidualAdd, ResidualRelu)
from resnet_keras.optimization.optimizers import l2_regularizer

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



# FFCV's rule: strided convolutions of fewer input channels (the stem's on
# RGB) keep their aliasing; a blur there would only smear the pixels.
BLUR_MIN_CHANNELS = 16


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
      in `resnet_keras.optimization.optimizers` (0: decay is applied
      elsewhere, or not).
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
                         normalize: Optional[Callable] = None,
                         compute_dtype: Optional[str] = None) -> tf_keras.Model:
  """Wraps `network` with the input the data pipeline delivers (of
  `image_size`; None: any). `normalize` ((images, dtype) -> normalised
  images): the normalisation the pipeline leaves to the device, the first
  layer (None: it delivers them normalised)."""
  inputs = layers.Input((image_size, image_size, 3), dtype=input_dtype,
                        name='pipeline_images')
  x = inputs
  if normalize:
    x = layers.Lambda(
        lambda t: normalize(t, compute_dtype or tf.float32),
        name='normalize_on_device')(x)
  return tf_keras.Model(inputs, network(x), name='training_model')


# What a run's data pipeline delivers: (the images' dtype, the normalisation
# it leaves to the device or None), data.datasets.pipeline_output's. Passed
# in so that the network imports nothing of the data.
PipelineOutput = Tuple[tf.DType, Optional[Callable]]


def _for_training(cfg: RunConfig, network: tf_keras.Model,
                  pipeline_output: PipelineOutput) -> tf_keras.Model:
  """`network` wrapped for the run's input, under the current policy."""
  input_dtype, normalize = pipeline_output
  return build_training_model(
      network, cfg.input_size, input_dtype, normalize,
      compute_dtype=tf_keras.mixed_precision.global_policy().compute_dtype)


def build_models(cfg: RunConfig, num_classes: int, use_regularizers: bool,
                 pipeline_output: PipelineOutput,
                 machine: Optional[hardware.Machine] = None, hvd: Any = None
                 ) -> Tuple[tf_keras.Model, tf_keras.Model]:
  """(network, training model) of a run, under the current precision policy.

  Training and `resnet_keras.validate` both build them here, so a
  checkpoint's object graph is the same in both.
  """
  network = build_network(cfg, num_classes, use_regularizers, machine, hvd)
  return network, _for_training(cfg, network, pipeline_output)


def logits_view(network: tf_keras.Model) -> tf_keras.Model:
  """`network` up to its head's logits, before the softmax: the same layers
  and variables, so a loss on the logits trains the network itself. A
  functional view: it bypasses StagewiseRecompute's call (RunConfig refuses
  --loss=bce with --enable_recompute)."""
  return tf_keras.Model(network.inputs, network.get_layer(HEAD_LAYER).output,
                        name=f'{network.name}_logits')


def build_logits_model(cfg: RunConfig, network: tf_keras.Model,
                       pipeline_output: PipelineOutput) -> tf_keras.Model:
  """The training model's twin that outputs the logits (--loss=bce): what
  the objective trains on, while the training model, evaluation and the
  export keep the softmax probabilities. Nothing tracks it: checkpoints
  hold the training model's variables, which are its own."""
  return _for_training(cfg, logits_view(network), pipeline_output)


def count_trainable_parameters(model: tf_keras.Model) -> int:
  return int(sum(tf.size(v).numpy() for v in model.trainable_variables))
