"""timm's training augmentations, in TensorFlow ops inside tf.data.

Per image: RandAugment (or TrivialAugment) on the 0-255 pixels after the
crop and flip, then random erasing. Per batch: mixup or CutMix with the
batch reversed as partner, and soft targets that carry the label smoothing.
The semantics are timm's ("ResNet strikes back"; timm/data/auto_augment.py,
random_erasing.py, mixup.py) unless a comment says otherwise.

Everything is TensorFlow ops (the tf.data service runs no Python) and
stateless: each random draw is a function of the run's seed and the
record's (or the batch's) position in the training order, so a resumed
seeded run augments exactly as the uninterrupted one, on every worker.

Why not tf-models-official's versions (official/vision/ops/augment.py):
their RandAugment and RandomErasing draw from stateful random ops (not
resumable), translate and cutout by absolute pixels (100 and 40: the whole
of a 28 px image), their CutMix takes the box's width from the height and
does not correct lambda for clipping, and their mixup smooths unmixed
batches by 0.1 whatever the run asks. Their pixel operations (contrast,
equalize, ...) are deterministic functions of their arguments, and those
are used here as they are, except the three built on their `blend`.

No function here needs AutoGraph (every branch is a tf.cond, switch_case
or while_loop), and the maps that call them say so: tf.data would otherwise
convert this module and official's augment module, function by function,
in every process that builds the pipeline (3 s on a Zen 4 core, the first
time; nothing after, as conversions are cached per process).
"""

import dataclasses
import math
from typing import Optional, Tuple

import tensorflow as tf

from resnet_keras.data.preprocessing import MEAN_RGB
from resnet_keras.data.preprocessing import augmentation_seed
from resnet_keras.config.randaugment_spec import MAX_MAGNITUDE
from resnet_keras.config.randaugment_spec import RandAugmentSpec

# ImageNet's per-channel standard deviation in 0-255 pixels: random erasing's
# noise is N(0, 1) after timm's normalisation, i.e. this in pixels.
STD_RGB = (58.395, 57.12, 57.375)

# Salts of the stateless seeds (preprocessing.augmentation_seed): 0 and 1
# are the crop and the flip.
RANDAUGMENT_SALT = 2
ERASING_SALT = 3
MIX_SALT = 4


def _seed(seed, index: int):
  return tf.random.experimental.stateless_fold_in(seed, index)


def _uniform(seed, index, low=0.0, high=1.0):
  return tf.random.stateless_uniform([], _seed(seed, index), low, high)


def _signed(value, seed, index):
  """`value` with a random sign (timm's _randomly_negate)."""
  return tf.where(_uniform(seed, index) < 0.5, -value, value)


# --- RandAugment's operations ---------------------------------------------
# Each takes uint8 pixels [H, W, 3], the level in [0, 1] (magnitude / 10),
# a seed for its sign and the fill colour, and returns uint8 pixels.


def _affine(image, matrix, fill):
  """Output pixel (x, y) from input (a x + b y + c, d x + e y + f),
  bilinear, `fill` outside (timm: PIL's affine with the mean as fill)."""
  transforms = tf.concat([matrix, tf.zeros([2])], 0)[None]

  def transformed(planes):
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=planes[None], transforms=transforms,
        output_shape=tf.shape(image)[:2], fill_value=0.0,
        interpolation='BILINEAR', fill_mode='CONSTANT')[0]

  # The fill is per channel: transform a plane of ones to find the pixels
  # that came from outside (partly, at the border), and blend.
  inside = transformed(tf.ones_like(image[..., :1], tf.float32))
  return _to_uint8(transformed(tf.cast(image, tf.float32)) +
                   (1.0 - inside) * fill)


def _to_uint8(pixels):
  return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8)


def _rotate(image, level, seed, fill):
  angle = _signed(30.0 * level, seed, 0) * (math.pi / 180.0)
  height, width = (tf.cast(d, tf.float32) for d in tf.unstack(
      tf.shape(image)[:2]))
  cx, cy = (width - 1) / 2, (height - 1) / 2
  cos, sin = tf.cos(angle), tf.sin(angle)
  return _affine(image, tf.stack([
      cos, -sin, cx - cos * cx + sin * cy,
      sin, cos, cy - sin * cx - cos * cy]), fill)


def _shear(axis):
  def shear(image, level, seed, fill):
    s = _signed(0.3 * level, seed, 0)
    matrix = [1.0, s, 0.0, 0.0, 1.0, 0.0] if axis == 'x' else [
        1.0, 0.0, 0.0, s, 1.0, 0.0]
    return _affine(image, tf.stack(matrix), fill)
  return shear


def _translate(axis):
  """By a fraction of the image's side (timm's TranslateXRel: 0.45 at
  magnitude 10), so 28 px and 224 px images move alike."""
  def translate(image, level, seed, fill):
    side = tf.cast(tf.shape(image)[1 if axis == 'x' else 0], tf.float32)
    t = _signed(0.45 * level, seed, 0) * side
    matrix = [1.0, 0.0, t, 0.0, 1.0, 0.0] if axis == 'x' else [
        1.0, 0.0, 0.0, 0.0, 1.0, t]
    return _affine(image, tf.stack(matrix), fill)
  return translate


def _posterize(bits):
  """Keeps the top `bits` bits (0: black, as PIL), with a mask: official's
  shifts are undefined for a shift of 8."""
  mask = tf.bitwise.left_shift(tf.constant(255, tf.int32),
                               8 - tf.cast(bits, tf.int32))
  return lambda image: tf.cast(tf.bitwise.bitwise_and(
      tf.cast(image, tf.int32), mask), tf.uint8)


def _blend(degenerate, image, factor):
  """PIL's ImageEnhance: degenerate + factor * (image - degenerate),
  clipped. official's blend computes the same, but tests the tensor
  `factor` with Python `if`s, so it needs AutoGraph."""
  degenerate = tf.cast(degenerate, tf.float32)
  blended = degenerate + factor * (tf.cast(image, tf.float32) - degenerate)
  return tf.cast(tf.clip_by_value(blended, 0.0, 255.0), tf.uint8)


def _color(image, factor):
  return _blend(tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image)),
                image, factor)


def _brightness(image, factor):
  return _blend(tf.zeros_like(image), image, factor)


def _sharpness(image, factor):
  """PIL's SMOOTH kernel inside the 1-pixel border, which keeps the
  image's pixels."""
  kernel = tf.tile(tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32,
                               [3, 3, 1, 1]) / 13.0, [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel,
                                  [1, 1, 1, 1], padding='VALID')[0]
  smooth = tf.cast(tf.clip_by_value(smooth, 0.0, 255.0), tf.uint8)
  border = [[1, 1], [1, 1], [0, 0]]
  inner = tf.pad(tf.ones_like(smooth), border)
  degenerate = tf.where(tf.equal(inner, 1), tf.pad(smooth, border), image)
  return _blend(degenerate, image, factor)


def _enhance(fn, increasing):
  """Colour, contrast, brightness, sharpness: a factor around 1."""
  def enhance(image, level, seed, fill):
    del fill
    if increasing:  # 1 +/- 0.9 level, at least 0.1
      factor = tf.maximum(0.1, 1.0 + _signed(0.9 * level, seed, 0))
    else:
      factor = level * 1.8 + 0.1
    return fn(image, factor)
  return enhance


def _ops(increasing: bool):
  """timm's RandAugment op set: _RAND_TRANSFORMS, or with inc1
  _RAND_INCREASING_TRANSFORMS (severity rises with the magnitude)."""
  # Imported here, not at the top: importing official.vision runs its
  # package's __init__ (tasks, configs, tensorflow_datasets), about 1.2 s of
  # every process's start on a 2-core EPYC, and only RandAugment needs it.
  from official.vision.ops import augment as official_augment  # pylint: disable=g-import-not-at-top
  if increasing:
    posterize = lambda image, level, seed, fill: _posterize(
        4 - tf.cast(level * 4, tf.int32))(image)
    solarize = lambda image, level, seed, fill: official_augment.solarize(
        image, tf.cast(256 - tf.cast(level * 256, tf.int32), tf.uint8))
  else:
    posterize = lambda image, level, seed, fill: _posterize(
        tf.cast(level * 4, tf.int32))(image)
    solarize = lambda image, level, seed, fill: official_augment.solarize(
        image, tf.cast(tf.minimum(tf.cast(level * 256, tf.int32), 255),
                       tf.uint8))
  plain = lambda fn: lambda image, level, seed, fill: fn(image)
  return (
      ('AutoContrast', plain(official_augment.autocontrast)),
      ('Equalize', plain(official_augment.equalize)),
      ('Invert', plain(official_augment.invert)),
      ('Rotate', _rotate),
      ('Posterize', posterize),
      ('Solarize', solarize),
      ('SolarizeAdd', lambda image, level, seed, fill:
       official_augment.solarize_add(image, tf.cast(level * 110, tf.int64))),
      ('Color', _enhance(_color, increasing)),
      ('Contrast', _enhance(official_augment.contrast, increasing)),
      ('Brightness', _enhance(_brightness, increasing)),
      ('Sharpness', _enhance(_sharpness, increasing)),
      ('ShearX', _shear('x')),
      ('ShearY', _shear('y')),
      ('TranslateXRel', _translate('x')),
      ('TranslateYRel', _translate('y')),
  )


def op_names(spec: RandAugmentSpec) -> Tuple[str, ...]:
  return tuple(name for name, _ in _ops(spec.increasing))


def fill_colour(image):
  """What geometric ops fill with: the pixel normalisation maps to 0 (the
  ImageNet mean, timm's fill), in grey for a grey image (all channels
  equal), so grey images stay grey."""
  mean = tf.constant(MEAN_RGB, tf.float32)
  grey = tf.reduce_all(tf.equal(image[..., :1], image))
  return tf.where(grey, tf.reduce_mean(mean) * tf.ones(3), mean)


def magnitude(spec: RandAugmentSpec, seed):
  """This application's magnitude: m, or N(m, mstd), or U(0, m) for
  mstd=inf (TrivialAugment: U(0, 10)), clipped to [0, 10]."""
  if spec.trivial or math.isinf(spec.magnitude_std):
    value = _uniform(seed, 0, 0.0, spec.magnitude)
  elif spec.magnitude_std > 0:
    value = spec.magnitude + spec.magnitude_std * tf.random.stateless_normal(
        [], _seed(seed, 0))
  else:
    value = tf.constant(spec.magnitude, tf.float32)
  return tf.clip_by_value(value, 0.0, MAX_MAGNITUDE)


def choose_ops(spec: RandAugmentSpec, seed):
  """Indices into op_names(spec) of the ops to try, uniform with
  replacement (timm), and whether each is applied."""
  count = len(_ops(spec.increasing))
  indices = tf.random.stateless_uniform([spec.num_ops], _seed(seed, 0), 0,
                                        count, dtype=tf.int32)
  applied = tf.random.stateless_uniform([spec.num_ops], _seed(seed, 1)) < (
      spec.prob)
  return indices, applied


def randaugment(image, spec: RandAugmentSpec, seed):
  """RandAugment on float 0-255 pixels [H, W, 3] (grey or colour)."""
  ops = [fn for _, fn in _ops(spec.increasing)]
  pixels = _to_uint8(image)
  fill = fill_colour(pixels)
  indices, applied = choose_ops(spec, seed)

  # A graph loop, not a Python one: the 15 branches are traced once, not
  # once per op, which halves building the input pipeline with n=2 (it is
  # rebuilt at each progressive-resizing size).
  def apply_op(i, pixels):
    op_seed = _seed(seed, 2 + i)
    level = magnitude(spec, _seed(op_seed, 0)) / MAX_MAGNITUDE
    branches = [
        (lambda fn=fn: fn(pixels, level, _seed(op_seed, 1), fill))
        for fn in ops]
    pixels = tf.cond(applied[i],
                     lambda: tf.switch_case(indices[i], branches),
                     lambda: pixels)
    return i + 1, tf.ensure_shape(pixels, image.shape)

  _, pixels = tf.while_loop(lambda i, _: i < spec.num_ops, apply_op,
                            (tf.constant(0), pixels))
  return tf.cast(pixels, tf.float32)


# --- Random erasing -------------------------------------------------------
ERASE_AREA = (0.02, 1 / 3)
ERASE_LOG_ASPECT = (math.log(0.3), math.log(1 / 0.3))
ERASE_ATTEMPTS = 10


def erasing_box(seed, height, width):
  """(top, left, h, w, found): timm's box: area a fraction in [0.02, 1/3]
  of the image's, log-uniform aspect in [0.3, 3.3]; the first of 10
  attempts that fits (found False: none did, nothing is erased)."""
  area = tf.cast(height * width, tf.float32)
  target = area * tf.random.stateless_uniform(
      [ERASE_ATTEMPTS], _seed(seed, 0), *ERASE_AREA)
  aspect = tf.exp(tf.random.stateless_uniform(
      [ERASE_ATTEMPTS], _seed(seed, 1), *ERASE_LOG_ASPECT))
  h = tf.cast(tf.round(tf.sqrt(target * aspect)), tf.int32)
  w = tf.cast(tf.round(tf.sqrt(target / aspect)), tf.int32)
  fits = (h < height) & (w < width)
  first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
  h, w = h[first], w[first]
  # Uniform integer offsets in [0, height - h] and [0, width - w].
  top = tf.cast(_uniform(seed, 2) * tf.cast(height - h + 1, tf.float32),
                tf.int32)
  left = tf.cast(_uniform(seed, 3) * tf.cast(width - w + 1, tf.float32),
                 tf.int32)
  return top, left, h, w, tf.reduce_any(fits)


def box_mask(height: int, width: int, top, bottom, left, right):
  """[height, width, 1]: True on rows [top, bottom) and columns [left,
  right), the box random erasing fills and CutMix pastes."""
  rows = tf.range(height)[:, None, None]
  cols = tf.range(width)[None, :, None]
  return (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)


def random_erasing(image, probability: float, mode: str, seed):
  """timm's RandomErasing on float 0-255 pixels [H, W, 3]: with
  `probability`, one box (erasing_box) filled with the mean ('const': 0
  after normalisation) or with per-pixel, per-channel noise, N(0, 1) after
  timm's normalisation ('pixel': mean + std * N(0, 1), clipped to 0-255)."""
  height, width = image.shape[0], image.shape[1]
  top, left, h, w, found = erasing_box(_seed(seed, 0), height, width)
  inside = box_mask(height, width, top, top + h, left, left + w)
  erase = found & (_uniform(seed, 1) < probability)
  mean = tf.constant(MEAN_RGB, tf.float32)
  if mode == 'pixel':
    noise = tf.random.stateless_normal(tf.shape(image), _seed(seed, 2))
    fill = tf.clip_by_value(mean + tf.constant(STD_RGB) * noise, 0.0, 255.0)
  else:
    fill = tf.broadcast_to(mean, tf.shape(image))
  return tf.where(inside & erase, fill, image)


@dataclasses.dataclass(frozen=True)
class ImageAugmentation:
  """What each training image gets after its crop and flip."""
  randaugment: Optional[RandAugmentSpec] = None
  erasing_prob: float = 0.0
  erasing_mode: str = 'pixel'

  def __bool__(self):
    return self.randaugment is not None or self.erasing_prob > 0

  @tf.autograph.experimental.do_not_convert
  def __call__(self, image, seed):
    """Float 0-255 pixels -> float 0-255 pixels. `seed`: the record's
    (augmentation_seed of its position, without salt)."""
    if self.randaugment is not None:
      image = randaugment(image, self.randaugment,
                          _seed(seed, RANDAUGMENT_SALT))
    if self.erasing_prob > 0:
      image = random_erasing(image, self.erasing_prob, self.erasing_mode,
                             _seed(seed, ERASING_SALT))
    return image


# --- Mixup and CutMix -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchMixing:
  """timm's Mixup in batch mode: one lambda (and one box) per batch, the
  partner of each image the batch reversed."""
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  prob: float = 1.0  # of mixing a batch at all
  switch_prob: float = 0.5  # of CutMix rather than mixup, when both are on
  label_smoothing: float = 0.0
  num_classes: int = 0

  def __bool__(self):
    return self.mixup_alpha > 0 or self.cutmix_alpha > 0

  @tf.autograph.experimental.do_not_convert
  def __call__(self, images, labels, seed):
    """(images [B, H, W, 3] of any dtype, int labels [B]) -> (mixed images
    of the same dtype, float32 targets [B, num_classes])."""
    lam, use_cutmix = mix_params(self, seed)
    height, width = images.shape[1], images.shape[2]
    box = cutmix_box(_seed(seed, 3), lam, height, width)
    reversed_images = tf.reverse(images, [0])

    def cutmix():
      yl, yh, xl, xh, corrected = box
      inside = box_mask(height, width, yl, yh, xl, xh)
      return tf.where(inside[None], reversed_images, images), corrected

    def mixup():
      mixed = lam * tf.cast(images, tf.float32) + (1 - lam) * tf.cast(
          reversed_images, tf.float32)
      # uint8 batches stay uint8, rounded (timm's FastCollateMixup does).
      if images.dtype == tf.uint8:
        mixed = tf.round(mixed)
      return tf.cast(mixed, images.dtype), lam

    mixed, lam = tf.cond(use_cutmix, cutmix, mixup)
    return mixed, mixed_targets(labels, self.num_classes, lam,
                                self.label_smoothing)


def _beta(seed, alpha: float):
  """Beta(alpha, alpha) from two stateless gammas."""
  x = tf.random.stateless_gamma([], _seed(seed, 0), alpha)
  y = tf.random.stateless_gamma([], _seed(seed, 1), alpha)
  return x / (x + y)


def mix_params(mixing: BatchMixing, seed):
  """(lambda, use CutMix) of a batch: with probability `prob` a mix, CutMix
  with `switch_prob` when both alphas are set; else lambda 1 (no mix)."""
  mixes = _uniform(seed, 0) < mixing.prob
  cutmix = lambda: _beta(_seed(seed, 2), mixing.cutmix_alpha)
  mixup = lambda: _beta(_seed(seed, 4), mixing.mixup_alpha)
  if mixing.mixup_alpha > 0 and mixing.cutmix_alpha > 0:
    use_cutmix = _uniform(seed, 1) < mixing.switch_prob
    lam = tf.where(use_cutmix, cutmix(), mixup())
  elif mixing.cutmix_alpha > 0:
    use_cutmix, lam = tf.constant(True), cutmix()
  else:
    use_cutmix, lam = tf.constant(False), mixup()
  return tf.where(mixes, lam, 1.0), use_cutmix & mixes


def cutmix_box(seed, lam, height: int, width: int):
  """(top, bottom, left, right, corrected lambda): timm's rand_bbox, a box
  of sides int(side * sqrt(1 - lam)) centred at a uniform pixel, clipped
  at the border; lambda becomes 1 - the clipped box's share of the image."""
  ratio = tf.sqrt(1.0 - lam)
  cut_h = tf.cast(height * ratio, tf.int32)
  cut_w = tf.cast(width * ratio, tf.int32)
  cy = tf.random.stateless_uniform([], _seed(seed, 0), 0, height, tf.int32)
  cx = tf.random.stateless_uniform([], _seed(seed, 1), 0, width, tf.int32)
  yl = tf.clip_by_value(cy - cut_h // 2, 0, height)
  yh = tf.clip_by_value(cy + cut_h // 2, 0, height)
  xl = tf.clip_by_value(cx - cut_w // 2, 0, width)
  xh = tf.clip_by_value(cx + cut_w // 2, 0, width)
  area = tf.cast((yh - yl) * (xh - xl), tf.float32)
  return yl, yh, xl, xh, 1.0 - area / float(height * width)


def smoothed_one_hot(labels, num_classes: int, smoothing: float):
  """timm's: off = smoothing / C, on = 1 - smoothing + off."""
  off = smoothing / num_classes
  return tf.one_hot(labels, num_classes, on_value=1.0 - smoothing + off,
                    off_value=off)


def mixed_targets(labels, num_classes: int, lam, smoothing: float):
  """lam * y + (1 - lam) * y reversed, each smoothed once (timm's
  mixup_target)."""
  y = smoothed_one_hot(labels, num_classes, smoothing)
  return lam * y + (1.0 - lam) * tf.reverse(y, [0])


def mix_batches(ds, mixing: BatchMixing, seed: Optional[int],
                start_batch: int = 0):
  """Batches of (images, labels) -> (mixed images, soft targets), each
  batch's draws keyed by its number in the training order (from
  `start_batch`, where a resumed run starts). `mixing` off: `ds` as is."""
  if not mixing:
    return ds
  return ds.enumerate(start=start_batch).map(
      lambda index, batch: mixing(*batch, augmentation_seed(
          seed, index, MIX_SALT)),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)
