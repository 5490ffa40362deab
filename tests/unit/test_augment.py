"""timm's augmentations in TensorFlow (resnet_keras/data/augment.py) against
hand-computed values and their published bounds."""

import math

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.data import augment
from resnet_keras.data.preprocessing import MEAN_RGB
from resnet_keras.data.preprocessing import training_order
from resnet_keras.config.randaugment_spec import RandAugmentSpec
from resnet_keras.config.randaugment_spec import format_randaugment
from resnet_keras.config.randaugment_spec import parse_randaugment


def seed(a, b=0):
  return tf.constant([a, b], tf.int64)


def grey_image(size, value_seed=0):
  rng = np.random.default_rng(value_seed)
  plane = rng.integers(0, 256, (size, size, 1)).astype(np.float32)
  return tf.constant(np.repeat(plane, 3, axis=-1))


# --- the grammar -----------------------------------------------------------


def test_randaugment_grammar_of_resnet_strikes_back():
  spec = parse_randaugment('rand-m7-mstd0.5-inc1')
  assert spec == RandAugmentSpec(num_ops=2, magnitude=7, magnitude_std=0.5,
                                 increasing=True, prob=0.5)
  assert parse_randaugment('rand-n3-m9-p1') == RandAugmentSpec(
      num_ops=3, magnitude=9, prob=1.0)
  assert parse_randaugment('rand-m9-mstdinf').magnitude_std == math.inf
  assert parse_randaugment('') is None and parse_randaugment('none') is None
  trivial = parse_randaugment('trivial')
  assert trivial.trivial and trivial.num_ops == 1 and trivial.prob == 1
  assert parse_randaugment(format_randaugment(spec)) == spec


@pytest.mark.parametrize('text', ['rand-x9', 'auto-m9', 'rand-m11',
                                  'rand-n0', 'rand-m9-p0', 'trivial-m3'])
def test_randaugment_grammar_rejects(text):
  with pytest.raises(ValueError):
    parse_randaugment(text)


# --- RandAugment ------------------------------------------------------------


def test_op_choice_and_magnitude_under_a_fixed_seed():
  spec = parse_randaugment('rand-m9-n2-mstd0.5-inc1')
  assert len(augment.op_names(spec)) == 15
  assert 'PosterizeIncreasing' not in augment.op_names(spec)  # one name each
  indices, applied = augment.choose_ops(spec, seed(1, 2))
  again, applied_again = augment.choose_ops(spec, seed(1, 2))
  assert indices.shape == (2,) and np.all((0 <= indices) & (indices < 15))
  np.testing.assert_array_equal(indices, again)
  np.testing.assert_array_equal(applied, applied_again)
  # Over many images every op is chosen, each about 1/15 of the time, and
  # about half the chosen ops are applied (p 0.5).
  draws = [augment.choose_ops(spec, seed(1, k)) for k in range(600)]
  counts = np.bincount(np.concatenate([d[0].numpy() for d in draws]),
                       minlength=15)
  assert counts.min() > 40 and counts.max() < 130
  assert 0.4 < np.mean([d[1].numpy() for d in draws]) < 0.6
  # Magnitude: m exactly without noise, N(m, 0.5) clipped to [0, 10] with.
  assert float(augment.magnitude(RandAugmentSpec(magnitude=7),
                                 seed(3))) == 7.0
  noisy = np.array([float(augment.magnitude(spec, seed(3, k)))
                    for k in range(300)])
  assert abs(noisy.mean() - 9) < 0.15 and 0.35 < noisy.std() < 0.6
  assert noisy.max() <= 10.0
  uniform = np.array([float(augment.magnitude(parse_randaugment('trivial'),
                                              seed(4, k)))
                      for k in range(300)])
  assert uniform.min() >= 0 and uniform.max() <= 10 and uniform.std() > 2.5


@pytest.mark.parametrize('size', [40, 80])
def test_translation_is_a_fraction_of_the_side(size):
  """TranslateXRel at level 0.5 moves by 0.45 * 0.5 * side (9 px of 40,
  18 of 80): the same share of a small image as of a large one."""
  image = np.zeros((size, size, 3), np.uint8)
  image[:, size // 2] = 200
  translate = dict(augment._ops(True))['TranslateXRel']
  moved = translate(tf.constant(image), tf.constant(0.5), seed(5),
                    tf.zeros(3)).numpy()
  column = int(np.argmax(moved[size // 2, :, 0]))
  assert abs(column - size // 2) == round(0.45 * 0.5 * size)


def test_every_op_keeps_a_grey_image_grey_and_its_shape():
  image = tf.cast(grey_image(28), tf.uint8)
  fill = augment.fill_colour(image)
  np.testing.assert_allclose(fill, [np.mean(MEAN_RGB)] * 3, rtol=1e-6)
  for name, op in augment._ops(True) + augment._ops(False):
    out = op(image, tf.constant(0.8), seed(6), fill).numpy()
    assert out.shape == (28, 28, 3) and out.dtype == np.uint8, name
    assert (out[..., 0] == out[..., 1]).all(), name
    assert (out[..., 1] == out[..., 2]).all(), name
  colour = tf.constant(np.random.default_rng(1).integers(
      0, 256, (8, 8, 3)), tf.uint8)
  np.testing.assert_allclose(augment.fill_colour(colour), MEAN_RGB)


@pytest.mark.parametrize('factor', [0.0, 0.1, 0.55, 1.0, 1.9])
def test_enhancements_compute_officials_without_autograph(factor):
  """Colour, brightness and sharpness as tf-models-official computes them
  (its `blend` branches on the factor in Python, run eagerly here), built
  in a graph that AutoGraph does not convert, as the input pipeline does."""
  from official.vision.ops import augment as official  # pylint: disable=g-import-not-at-top
  image = tf.constant(np.random.default_rng(2).integers(0, 256, (9, 7, 3)),
                      tf.uint8)
  ours = tf.function(autograph=False)(lambda x, f: (
      augment._color(x, f), augment._brightness(x, f),
      augment._sharpness(x, f)))(image, tf.constant(factor))
  theirs = (official.color(image, factor), official.brightness(image, factor),
            official.sharpness(image, factor))
  for name, a, b in zip(('color', 'brightness', 'sharpness'), ours, theirs):
    np.testing.assert_array_equal(a, b, err_msg=name)


def test_randaugment_is_a_function_of_its_seed():
  spec = parse_randaugment('rand-m9-n2-mstd0.5-inc1-p1')
  image = grey_image(28)
  first = augment.randaugment(image, spec, seed(7, 1))
  np.testing.assert_array_equal(first, augment.randaugment(image, spec,
                                                           seed(7, 1)))
  others = [augment.randaugment(image, spec, seed(7, k)) for k in range(2, 6)]
  assert any(np.any(o != first) for o in others)


# --- random erasing --------------------------------------------------------


def test_erasing_box_area_and_aspect_within_timms_bounds():
  height, width = 224, 160
  for k in range(200):
    top, left, h, w, found = (int(v) for v in augment.erasing_box(
        seed(8, k), height, width))
    if not found:
      continue
    # Rounding each side moves the area by at most (h + w) / 2 + 1/4.
    slack = (h + w) / 2 + 1
    assert 0.02 * height * width - slack <= h * w <= (
        height * width / 3 + slack)
    assert 0.3 * (1 - 2 / min(h, w)) <= h / w <= (1 / 0.3) * (
        1 + 2 / min(h, w))
    assert 0 <= top <= height - h and 0 <= left <= width - w


def test_random_erasing_fills_one_box():
  image = tf.fill([32, 32, 3], 7.0)
  assert np.all(augment.random_erasing(image, 0.0, 'pixel', seed(9)) == 7)
  erased = augment.random_erasing(image, 1.0, 'const', seed(9)).numpy()
  changed = np.any(erased != 7, axis=-1)
  rows, cols = np.nonzero(changed)
  assert changed.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # a box
  np.testing.assert_allclose(erased[rows[0], cols[0]], MEAN_RGB)
  noisy = augment.random_erasing(image, 1.0, 'pixel', seed(9)).numpy()
  inside = noisy[changed]
  assert inside.std() > 30 and inside.min() >= 0 and inside.max() <= 255
  assert np.all(noisy[~changed] == 7)


# --- mixup and CutMix ------------------------------------------------------


def test_mixup_blends_images_and_targets_by_one_lambda():
  mixing = augment.BatchMixing(mixup_alpha=0.2, label_smoothing=0.1,
                               num_classes=2)
  images = tf.concat([tf.zeros([1, 4, 4, 3]), tf.ones([1, 4, 4, 3])], 0)
  mixed, targets = mixing(images, tf.constant([0, 1]), seed(10))
  lam = 1.0 - float(mixed[0, 0, 0, 0])  # image 0 is 0s, its partner 1s
  np.testing.assert_allclose(mixed[0], np.full((4, 4, 3), 1 - lam), atol=1e-5)
  np.testing.assert_allclose(mixed[1], np.full((4, 4, 3), lam), atol=1e-5)
  # Smoothing once, inside: on 0.95, off 0.05.
  np.testing.assert_allclose(
      targets[0], [lam * 0.95 + (1 - lam) * 0.05,
                   lam * 0.05 + (1 - lam) * 0.95], rtol=1e-5)
  np.testing.assert_allclose(tf.reduce_sum(targets, -1), [1, 1], rtol=1e-6)


def test_uint8_mixup_rounds_as_timms_fast_collate():
  mixing = augment.BatchMixing(mixup_alpha=1.0, num_classes=3)
  images = tf.constant(np.stack([np.full((2, 2, 3), 10),
                                 np.full((2, 2, 3), 201)]), tf.uint8)
  mixed, targets = mixing(images, tf.constant([2, 0]), seed(11))
  lam = float(targets[0, 2])
  assert mixed.dtype == tf.uint8
  assert int(mixed[0, 0, 0, 0]) == round(lam * 10 + (1 - lam) * 201)


def test_cutmix_box_and_its_corrected_lambda():
  lam = tf.constant(0.75)
  yl, yh, xl, xh, corrected = (v.numpy() for v in augment.cutmix_box(
      seed(12), lam, 32, 32))
  # Sides int(32 * sqrt(0.25)) = 16, centred, clipped at the border.
  assert 0 <= yl <= yh <= 32 and 0 <= xl <= xh <= 32
  assert yh - yl <= 16 and xh - xl <= 16
  assert corrected == pytest.approx(1 - (yh - yl) * (xh - xl) / 1024)
  # A whole-image box (lambda 0) centred off the middle is clipped: lambda
  # is corrected to the part of the image it leaves.
  for k in range(20):
    yl, yh, xl, xh, corrected = (v.numpy() for v in augment.cutmix_box(
        seed(12, k), tf.constant(0.0), 32, 32))
    assert corrected == pytest.approx(1 - (yh - yl) * (xh - xl) / 1024)
    assert (corrected > 0) == ((yh - yl) * (xh - xl) < 1024)

  mixing = augment.BatchMixing(cutmix_alpha=1.0, num_classes=4)
  images = tf.concat([tf.zeros([1, 32, 32, 3]), tf.ones([1, 32, 32, 3])], 0)
  mixed, targets = mixing(images, tf.constant([0, 3]), seed(13))
  pasted = float(tf.reduce_mean(mixed[0]))  # share of image 0 from image 1
  np.testing.assert_allclose(targets[0], [1 - pasted, 0, 0, pasted],
                             atol=1e-6)


def test_mix_probability_and_switch():
  off = augment.BatchMixing(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.0,
                            label_smoothing=0.1, num_classes=10)
  images = tf.random.uniform([4, 8, 8, 3])
  mixed, targets = off(images, tf.constant([1, 2, 3, 4]), seed(14))
  np.testing.assert_array_equal(mixed, images)
  np.testing.assert_allclose(targets, augment.smoothed_one_hot(
      tf.constant([1, 2, 3, 4]), 10, 0.1))
  both = augment.BatchMixing(mixup_alpha=0.2, cutmix_alpha=1.0,
                             num_classes=10)
  cutmix = [bool(augment.mix_params(both, seed(15, k))[1])
            for k in range(200)]
  assert 0.4 < np.mean(cutmix) < 0.6


def test_a_resumed_stream_mixes_its_batches_as_the_whole_one():
  batches = tf.data.Dataset.from_tensor_slices(
      (tf.random.uniform([6, 2, 8, 8, 3], seed=1),
       tf.constant([[0, 1]] * 6)))
  mixing = augment.BatchMixing(mixup_alpha=0.5, cutmix_alpha=1.0,
                               num_classes=2)
  whole = list(augment.mix_batches(batches, mixing, seed=3))
  resumed = list(augment.mix_batches(batches.skip(4), mixing, seed=3,
                                     start_batch=4))
  for (a, ta), (b, tb) in zip(whole[4:], resumed):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ta, tb)


# --- repeated augmentation -------------------------------------------------


def test_repeated_records_come_in_runs_at_positions_of_their_own():
  records = tf.data.Dataset.range(10)
  order = list(training_order(records, 10, seed=1, repeats=3).take(30))
  positions = [int(p) for p, _ in order]
  values = [int(v) for _, v in order]
  assert positions == list(range(30))
  assert all(values[i] == values[i - i % 3] for i in range(30))
  assert sorted(values[::3]) == list(range(10))  # one pass of 10 records
  resumed = list(training_order(records, 10, seed=1, start=7, repeats=3)
                 .take(5))
  assert [(int(p), int(v)) for p, v in resumed] == [
      (p, v) for p, v in zip(positions[7:12], values[7:12])]
