"""python -m resnet_keras.predict on trained runs' exports, and the
SavedModel's encoded-image signature."""

import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_keras.serving import contract
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import MEAN_RGB
from tests.support import runner
from tests.support.images import encode, parse_predictions, write_images
from tests.support.records import CLASS_NAMES


def _predict(saved_model, *args, **kwargs):
  return runner.run_tool('resnet_keras.predict',
                         ['--saved_model', saved_model] + list(args), **kwargs)


def test_top5_with_names_for_png_and_jpeg(records_run, tmp_path):
  _, model_dir = records_run
  saved_model = os.path.join(model_dir, 'saved_model')
  paths = write_images(str(tmp_path / 'images'))
  result = _predict(saved_model, *paths)
  assert result.returncode == 0, result.stderr[-3000:]
  results = parse_predictions(result.stdout)
  assert list(results) == paths
  for top in results.values():
    assert len(top) == 5
    probabilities = [p for p, _ in top]
    assert probabilities == sorted(probabilities, reverse=True)
    assert all(0 <= p <= 1 for p in probabilities)
    assert sum(probabilities) <= 1 + 5 * 0.5e-4   # printed to 4 decimals
    names = [n for _, n in top]
    assert len(set(names)) == 5 and set(names) <= set(CLASS_NAMES)

  # A folder stands for its images, sorted; --labels renames the classes.
  labels = tmp_path / 'labels.txt'
  labels.write_text(''.join(f'name {i}\n' for i in range(6)))
  from_folder = _predict(saved_model, '--labels', str(labels),
                         str(tmp_path / 'images'))
  assert from_folder.returncode == 0, from_folder.stderr[-3000:]
  renamed = parse_predictions(from_folder.stdout)
  assert list(renamed) == sorted(paths)
  for path, top in results.items():
    assert [p for p, _ in renamed[path]] == [p for p, _ in top]
    assert [n for _, n in renamed[path]] == [
        f'name {CLASS_NAMES.index(n)}' for _, n in top]


def test_without_labels_classes_are_indices(synthetic_run, tmp_path):
  paths = write_images(str(tmp_path))
  result = _predict(os.path.join(synthetic_run, 'saved_model'), paths[0])
  assert result.returncode == 0, result.stderr[-3000:]
  (top,) = parse_predictions(result.stdout).values()
  assert len(top) == 5
  assert all(name.startswith('class ') and 0 <= int(name.split()[1]) < 10
             for _, name in top)


def test_encoded_signature_is_the_eval_preprocessing(records_run):
  """serving_encoded == preprocess_eval with the run's crop, then the model."""
  _, model_dir = records_run
  loaded = tf.saved_model.load(os.path.join(model_dir, 'saved_model'))
  rng = np.random.RandomState(1)
  jpeg = encode(rng.randint(0, 256, (70, 41, 3), np.uint8), 'JPEG')
  encoded = loaded.signatures[contract.ENCODED_SIGNATURE](
      image_bytes=tf.constant([jpeg]))['probabilities'].numpy()

  def on_pixels(crop_fraction):
    normalised = imagenet.preprocess_eval(jpeg, 32, tf.float32, crop_fraction)
    pixels = normalised + tf.constant(MEAN_RGB)
    return loaded.signatures['serving_default'](
        images=pixels[tf.newaxis])['probabilities'].numpy()

  np.testing.assert_allclose(encoded, on_pixels(0.5), rtol=1e-4, atol=1e-6)
  assert not np.allclose(encoded, on_pixels(1.0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('case,fragments', [
    ('no_saved_model', ['is not a SavedModel']),
    ('missing_image', ['does not exist']),
    ('not_an_image', ['is not a JPEG or PNG image']),
    ('empty_folder', ['has no .jpg, .jpeg or .png files']),
    ('too_many_labels', ['names 7 classes but the model has 6']),
    ('no_images', ['pass one or more image files']),
])
def test_bad_inputs_fail_in_one_line(records_run, tmp_path, case, fragments):
  saved_model = os.path.join(records_run[1], 'saved_model')
  image = write_images(str(tmp_path / 'images'))[0]
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'text.png').write_text('not an image')
  (tmp_path / 'labels.txt').write_text('a\nb\nc\nd\ne\nf\ng\n')
  args = {
      'no_saved_model': ['--saved_model', str(tmp_path), image],
      'missing_image': [str(tmp_path / 'nope.jpg')],
      'not_an_image': [str(tmp_path / 'text.png')],
      'empty_folder': [str(tmp_path / 'empty')],
      'too_many_labels': ['--labels', str(tmp_path / 'labels.txt'), image],
      'no_images': [],
  }[case]
  result = _predict(saved_model, *args)
  runner.assert_one_line_error(result, *fragments)


def test_eval_flip_averages_each_image_with_its_mirror(records_run, tmp_path):
  """--eval_flip prints the flip average (trainer.flip_average) of the
  model's probabilities for the image and for its mirror image."""
  _, model_dir = records_run
  saved_model = os.path.join(model_dir, 'saved_model')
  path = write_images(str(tmp_path / 'images'))[1]  # the RGB JPEG
  result = _predict(saved_model, '--eval_flip', path)
  assert result.returncode == 0, result.stderr[-3000:]
  printed = parse_predictions(result.stdout)[path]

  predict = tf.saved_model.load(saved_model).signatures[
      contract.ENCODED_SIGNATURE]
  with open(path, 'rb') as f:
    encoded = f.read()
  pixels = tf.io.decode_jpeg(encoded).numpy()
  views = [encoded, encode(np.ascontiguousarray(pixels[:, ::-1]), 'PNG')]
  probs = predict(image_bytes=tf.constant(views))['probabilities'].numpy()
  logits = np.log(probs)
  expected = np.exp(logits.mean(0)) / np.exp(logits.mean(0)).sum()
  top = np.argsort(-expected, kind='stable')[:5]
  assert [n for _, n in printed] == [CLASS_NAMES[i] for i in top]
  np.testing.assert_allclose([p for p, _ in printed], expected[top],
                             atol=0.6e-4)
  # Different from either view alone (the tiny model is not symmetric).
  assert not np.allclose(expected, probs[0], atol=1e-4)
