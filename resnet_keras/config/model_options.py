"""The model's option groups: the network (ModelConfig) and how its
weights start when model_dir has no checkpoint (WarmStartConfig); each with
its choices and its own checks."""

import dataclasses
import math
from typing import Optional, Tuple

from common.errors import UsageError
from resnet_keras.config.channels import STAGE_FILTERS, scaled_filters
from resnet_keras.config.options import check_fields, one_of, option

RESNET_DEPTHS = (10, 18, 34, 50, 101, 152)
NORMS = ('batch', 'group')
# Stem -> how much it downsamples. The stages downsample 8x more, so an image
# must be at least 8 x this many pixels for the last stage to see 1x1.
STEM_STRIDES = {'imagenet': 4, 'small': 2, 'cifar': 1}
STAGE_STRIDE = 8
KERAS_APPLICATIONS_MODELS = ('ResNet50', 'ResNet101', 'ResNet152',
                             'ResNet50V2', 'ResNet101V2', 'ResNet152V2')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The network."""
  resnet_depth: int = option(
      50,
      f'ResNet v1.5 depth: {one_of(RESNET_DEPTHS)} (10: one basic block '
      'per stage).',
      choices=RESNET_DEPTHS)
  stem: str = option(
      'imagenet',
      'First layers before the residual stages: imagenet (7x7/2 conv + '
      '3x3/2 max pool), small (3x3/1 conv + max pool: for 28-64 px '
      'images, 4x the compute at the same size) or cifar (3x3/1 conv, '
      'no pool: 16x).',
      choices=tuple(STEM_STRIDES))
  keras_applications_model: Optional[str] = option(
      None,
      'Use a keras.applications backbone instead: '
      f'{", ".join(KERAS_APPLICATIONS_MODELS)}.',
      choices=KERAS_APPLICATIONS_MODELS)
  width_multiplier: float = option(
      1.0,
      'Channels of every layer x this, rounded to multiples of 8 '
      "(Wide-ResNet's k; below 1 for a cheaper model): 0.25 trains "
      'ResNet-18 on 28x28 images several times faster on CPUs '
      '(the recipe fashion_mnist_resnet18_w025). 1: the standard '
      'ResNet.',
      within='> 0')
  stage_widths: Tuple[int, ...] = option(
      (),
      'Output channels of the stem and the four stages (a bottleneck '
      "block's inner ones; 4x leave it), e.g. 24,48,96,192, instead of "
      "the standard ones x --width_multiplier (given, it replaces that): a "
      "shape the CPU's kernels like. Empty: the standard widths.")
  norm: str = option(
      'batch',
      'Normalisation after each convolution: batch, or group '
      '(GroupNormalization: independent of the batch, for small '
      'per-replica batches; no moving statistics).',
      choices=NORMS)
  groups: int = option(
      32,
      '--norm=group: channel groups per layer; must divide 64 (every '
      'channel count of the ResNets).')
  sync_batch_norm: bool = option(
      False,
      'Batch statistics over the global batch (all-reduced across '
      'tf.distribute replicas, or Horovod workers) instead of each '
      "replica's own batch.")
  enable_recompute: bool = option(
      False,
      "Keep only each residual stage's input during the forward pass "
      'and recompute its activations in the backward pass '
      '(tf.recompute_grad): less memory for about one more forward pass '
      'of compute.')
  blurpool: bool = option(
      False,
      "Anti-aliased downsampling (BlurPool, as in FFCV's ResNets): "
      'inputs of strided convolutions blurred by a fixed 3x3 binomial '
      "filter, the stem's max pooling at stride 1 then blurred and "
      "subsampled. No new weights; part of the model's identity for "
      'resume and warm start.')
  drop_path_rate: float = option(
      0.0,
      'Stochastic depth: training drops each residual branch per example, '
      'at a rate rising from 0 (first block) to this (last), survivors x '
      '1/keep (0.05: ResNet strikes back A1/A2). No new weights. 0: off.',
      within='[0, 1)', says='is a rate,')

  @property
  def model_name(self) -> str:
    if self.keras_applications_model:
      return self.keras_applications_model
    if self.stage_widths:
      width = '_c' + '-'.join(map(str, self.stage_widths))
    elif self.width_multiplier == 1:
      width = ''
    else:
      width = f'_w{self.width_multiplier:g}'
    return f'resnet{self.resnet_depth}{width}'

  @property
  def stage_filters(self) -> Tuple[int, ...]:
    if self.stage_widths:
      return tuple(self.stage_widths)
    return scaled_filters(STAGE_FILTERS, self.width_multiplier)

  @property
  def norm_name(self) -> str:
    """'batch' or 'group<groups>': what the normalisation weights of a
    checkpoint mean (sync batch norm has batch norm's)."""
    return f'group{self.groups}' if self.norm == 'group' else self.norm

  @property
  def min_image_size(self) -> int:
    """Smallest input for which the last stage still sees 1x1."""
    if self.keras_applications_model:
      return STAGE_STRIDE * STEM_STRIDES['imagenet']
    return STAGE_STRIDE * STEM_STRIDES[self.stem]

  def _check_model(self) -> None:
    check_fields(self, ModelConfig)
    if self.stage_widths:
      widths = tuple(self.stage_widths)
      if len(widths) != len(STAGE_FILTERS) or min(widths) < 1:
        raise UsageError('--stage_widths takes the channels of the '
                         f'{len(STAGE_FILTERS)} stages, each >= 1 (e.g. '
                         f'24,48,96,192), got {",".join(map(str, widths))}')
    if self.norm == 'group':
      # Groups must divide every channel count; each one (bottlenecks' 4x
      # included) is a multiple of the stages' gcd.
      common = math.gcd(*self.stage_filters)
      if self.groups <= 0 or common % self.groups:
        divisors = [d for d in range(1, common + 1) if common % d == 0]
        raise UsageError(
            f'--groups={self.groups} must divide every channel count of the '
            f'ResNet (multiples of {common}); use one of: '
            f'{", ".join(map(str, divisors))}')
      if self.sync_batch_norm:
        raise UsageError('--sync_batch_norm needs --norm=batch: group norm '
                         'has no batch statistics to synchronise')


# How the stem's convolution starts (stem_init.pca_stem_kernel).
STEM_INITS = ('random', 'pca')


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """How the weights start when model_dir has no checkpoint (start.py):
  from another run's checkpoint, or from initialisers some of which read
  the data or zero a scale."""
  zero_init_residual: bool = option(
      False,
      'Start the scale (gamma) of the last normalisation in each '
      'residual branch at 0, so every block begins as its shortcut and '
      'the network as a shallow one (Goyal et al., "ImageNet in 1 '
      'hour"). Only the initial values change: checkpoints and exports '
      'are the same either way.')
  stem_init: str = option(
      'random',
      "How the stem's convolution starts: random (He normal) or pca: "
      'its filters, in +/- pairs, are the principal directions of '
      "patches of the first training images (as many as the patches' "
      'rank and half the filters allow; the rest stay random), so its '
      'channels start decorrelated instead of all seeing the local '
      "brightness (airbench's whitening, as an initialisation: the "
      'filters keep training). Only the initial values change.',
      choices=STEM_INITS)
  restore_from: Optional[str] = option(
      None,
      "Start a new run from another run's checkpoint (a checkpoint "
      'prefix such as DIR/ckpt-8, or a model_dir: its latest) of the '
      'same model; only while --model_dir has no checkpoint of its own '
      '(then it resumes). TensorFlow reads a checkpoint as trusted input: '
      'take only checkpoints you trust.', path=True)
  restore_optimizer: bool = option(
      False,
      'With --restore_from: also restore the optimizer (momentum slots, '
      'step, loss scale), so training goes on from that step; default: '
      'weights only, step 0.')
  pretrained_checkpoint: Optional[str] = option(
      None,
      'Transfer learning: load every layer but the classification head '
      "from another run's checkpoint (prefix or model_dir) of the same "
      "architecture; the head is new, for this data's classes. TensorFlow "
      'reads a checkpoint as trusted input: take only checkpoints you '
      'trust.', path=True)
  freeze_backbone: bool = option(
      False,
      'With --pretrained_checkpoint: train only the head; the '
      "backbone's batch norm keeps its pretrained statistics (inference "
      'mode).')

  def _check_warm_start(self) -> None:
    check_fields(self, WarmStartConfig)
    if self.restore_from and self.pretrained_checkpoint:
      raise UsageError('--restore_from (the whole model) and '
                       '--pretrained_checkpoint (its backbone) both choose the '
                       'starting weights; use one')
    if self.restore_optimizer and not self.restore_from:
      raise UsageError('--restore_optimizer restores the optimizer of '
                       '--restore_from; give --restore_from too')
    if self.freeze_backbone and not self.pretrained_checkpoint:
      raise UsageError('--freeze_backbone trains only the head on top of '
                       '--pretrained_checkpoint; give --pretrained_checkpoint '
                       'too')
