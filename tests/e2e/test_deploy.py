"""ONNX and TFLite exports (python -m resnet_keras.export --format): every
format and quantisation of one trained run against its SavedModel, validate
and predict on them, and what a missing package does. (The architectures
the trainer builds, converted: unit/.)"""

import csv
import json
import os
import sys

import numpy as np
import onnx
import pytest

from resnet_keras.rundir import checkpoints
from resnet_keras.tools import scoring
from resnet_keras.data import datasets
from resnet_keras.serving import contract
from resnet_keras.serving import deployment
from resnet_keras.serving import readers
from tests.support import runner
from tests.support.images import parse_predictions, write_images
from tests.support.records import CLASS_NAMES

# The module's exports are written once, in one worker.
# Slow (not in ./scripts/test.sh --quick): every test reads the
# module's exports, which took 80 s to write in the suite under load.
pytestmark = [pytest.mark.xdist_group('deploy'), pytest.mark.slow]

FLOAT32_FILES = ('model.onnx', 'model.tflite')
QUANTIZED_FILES = ('model_float16.tflite', 'model_dynamic.tflite',
                   'model_int8.tflite')
# Largest probability difference from the SavedModel on the run's
# validation images: 1e-4 for float32 files (they measure 6e-8); for the
# quantised, about 10x what they measure on the seeded records run (5e-5,
# 0.0015, 0.0042; over 12 seeds the int8 file's ranged 0.003-0.019).
TOLERANCE = {'model.onnx': 1e-4, 'model.tflite': 1e-4,
             'model_float16.tflite': 0.001, 'model_dynamic.tflite': 0.015,
             'model_int8.tflite': 0.04}


def _centred_correlation(probs, reference):
  centre = lambda p: (p - p.mean(-1, keepdims=True)).ravel()
  return np.corrcoef(centre(probs), centre(reference))[0, 1]


@pytest.fixture(scope='module')
def exports(records_run, tmp_path_factory):
  """(model_dir, the checkpoint's export dir, the tool's stdout): ckpt-8 of
  the records run in every format and quantisation."""
  _, model_dir = records_run
  out = str(tmp_path_factory.mktemp('deploy'))
  result = runner.run_tool('resnet_keras.export', [
      '--model_dir', model_dir, '--output_dir', out,
      '--format', 'saved_model,onnx,tflite',
      '--quantize', 'none,float16,dynamic,int8',
      '--representative_images', '12'])
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, os.path.join(out, 'ckpt-8'), result.stdout


@pytest.fixture(scope='module')
def validation_pixels(exports):
  """The records run's 9 validation images as the exports take them."""
  cfg, _ = checkpoints.read_config(exports[0])
  return deployment.stacked(
      datasets.pixel_batches(cfg, datasets.describe(cfg), 4), 100)


def test_every_file_gives_the_saved_models_probabilities(exports,
                                                        validation_pixels):
  _, out, stdout = exports
  assert validation_pixels.shape == (9, 32, 32, 3)
  assert validation_pixels.dtype == np.uint8
  reference = readers.load(os.path.join(out, contract.CLASSIFIER_DIR))(
      validation_pixels)
  for name in FLOAT32_FILES + QUANTIZED_FILES:
    probs = readers.load(os.path.join(out, name))(validation_pixels)
    assert probs.shape == reference.shape and probs.dtype == np.float32
    # int8 quantises the softmax in steps of 1/256.
    np.testing.assert_allclose(probs.sum(-1), 1, atol=0.01)
    assert np.max(np.abs(probs - reference)) <= TOLERANCE[name], name
    # Eight steps leave every probability near 1/6, so a file that ignored
    # its input would pass the bound above: each file must also follow the
    # SavedModel's departures from the mean (int8 0.98-0.998 over 12 seeds).
    assert _centred_correlation(probs, reference) >= 0.95, name
    # The tool checked each file as it wrote it, and said so.
    assert f'{name} (' in stdout and 'validation images' in stdout
  # Quantised files are what they claim: half, then a quarter, the size.
  size = lambda name: os.path.getsize(os.path.join(out, name))
  assert size('model_float16.tflite') < 0.6 * size('model.tflite')
  for name in ('model_dynamic.tflite', 'model_int8.tflite'):
    assert size(name) < 0.35 * size('model.tflite')


def test_int8_takes_the_pixels_unscaled_and_computes_in_int8(exports):
  from ai_edge_litert import interpreter  # pylint: disable=g-import-not-at-top
  tflite = interpreter.Interpreter(
      model_path=os.path.join(exports[1], 'model_int8.tflite'))
  image, = tflite.get_input_details()
  assert image['dtype'] == np.uint8 and image['quantization'] == (1.0, 0)
  assert tflite.get_output_details()[0]['dtype'] == np.float32
  kinds = {t['dtype'] for t in tflite.get_tensor_details()}
  assert np.int8 in kinds and np.int32 in kinds  # weights, biases


def test_each_file_carries_its_labels_size_crop_and_step(exports):
  out = exports[1]
  expected = {'labels': '\n'.join(CLASS_NAMES), 'image_size': '32',
              'eval_crop_fraction': '0.5', 'checkpoint': 'ckpt-8',
              'step': '8'}
  props = {p.key: p.value
           for p in onnx.load(os.path.join(out, 'model.onnx')).metadata_props}
  assert expected.items() <= props.items() and props['quantize'] == 'none'
  for q in contract.QUANTIZATIONS:
    with open(os.path.join(out, contract.file_name('tflite', q)) + '.json') as f:
      sidecar = json.load(f)
    assert expected.items() <= sidecar.items() and sidecar['quantize'] == q
  loaded = readers.load(os.path.join(out, 'model_int8.tflite'))
  assert (loaded.labels, loaded.image_size, loaded.num_classes,
          loaded.step) == (list(CLASS_NAMES), 32, 6, 8)


def test_validate_scores_every_format_side_by_side(exports, validation_pixels):
  model_dir, out, _ = exports
  names = [contract.CLASSIFIER_DIR] + list(FLOAT32_FILES + QUANTIZED_FILES)
  paths = [os.path.join(out, n) for n in names]
  result = runner.run_tool('resnet_keras.validate', [
      '--model_dir', model_dir, '--saved_model', ','.join(paths)])
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(model_dir, scoring.EXPORTS_RESULTS_FILE)) as f:
    rows = list(csv.DictReader(f))
  assert [r['export'] for r in rows] == paths
  assert [r['kind'] for r in rows] == [
      'SavedModel', 'ONNX', 'TFLite', 'TFLite float16', 'TFLite dynamic',
      'TFLite int8']
  saved = rows[0]
  assert int(saved['examples']) == 9 and float(saved['max_prob_diff']) == 0
  # The top-1 a reader can check by hand from the SavedModel's outputs.
  cfg, _ = checkpoints.read_config(model_dir)
  labels = np.concatenate([l.numpy() for _, l in datasets.pixel_batches(
      cfg, datasets.describe(cfg), 4)])
  probs = readers.load(paths[0])(validation_pixels)
  assert float(saved['top1']) == pytest.approx(
      np.mean(np.argmax(probs, -1) == labels))
  for row, name in zip(rows[1:], names[1:]):
    assert int(row['examples']) == 9
    assert float(row['max_prob_diff']) <= TOLERANCE[name]
    if name in FLOAT32_FILES:
      assert row['top1'] == saved['top1'] and row['top5'] == saved['top5']
  assert 'TFLite int8' in result.stdout


def test_predict_reads_onnx_and_tflite_files_like_the_saved_model(exports,
                                                                 tmp_path):
  out = exports[1]
  images = write_images(str(tmp_path / 'images'))
  outputs = {}
  # (Not int8: random images are far from what it was calibrated on.)
  for name in (contract.CLASSIFIER_DIR, 'model.onnx', 'model.tflite'):
    result = runner.run_tool('resnet_keras.predict', [
        '--saved_model', os.path.join(out, name), '--eval_flip'] + images)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs[name] = parse_predictions(result.stdout)
  saved = outputs.pop(contract.CLASSIFIER_DIR)
  assert list(saved) == images
  for name, parsed in outputs.items():
    for path in images:
      # The same classes, named from the labels the file carries.
      assert {n for _, n in parsed[path]} == {n for _, n in saved[path]}
      assert {n for _, n in parsed[path]} <= set(CLASS_NAMES)
      # Printed to 4 decimals; on these random images the files differ
      # from the SavedModel by up to 1.0e-3 (one CI run: 0.3165 against
      # 0.3175), against 6e-8 on the run's own validation pixels above.
      for (p, _), (q, _) in zip(parsed[path], saved[path]):
        assert p == pytest.approx(q, abs=2e-3)


def test_a_missing_package_is_named_and_nothing_is_written(exports, tmp_path,
                                                          monkeypatch):
  model_dir, out, _ = exports
  before = os.path.getmtime(os.path.join(out, 'model.onnx'))
  monkeypatch.setitem(sys.modules, 'tf2onnx', None)  # import fails
  runner.assert_one_line_error(
      runner.run_tool('resnet_keras.export', [
          '--model_dir', model_dir, '--output_dir', os.path.dirname(out),
          '--format', 'onnx']),
      'needs the tf2onnx package', 'requirements-deploy.txt')
  assert os.path.getmtime(os.path.join(out, 'model.onnx')) == before
  monkeypatch.setitem(sys.modules, 'ai_edge_litert.interpreter', None)
  runner.assert_one_line_error(
      runner.run_tool('resnet_keras.predict', [
          '--saved_model', os.path.join(out, 'model.tflite'),
          write_images(str(tmp_path))[0]]),
      'needs the ai-edge-litert package')


def test_bad_inputs_fail_in_one_line(exports, synthetic_run, tmp_path):
  model_dir, out, _ = exports
  (tmp_path / 'notes.txt').write_text('')
  (tmp_path / 'orphan.tflite').write_bytes(
      open(os.path.join(out, 'model.tflite'), 'rb').read())
  tool = lambda module, *args: runner.run_tool(
      f'resnet_keras.{module}', ['--model_dir', model_dir] + list(args))
  for result, fragments in [
      (tool('export', '--quantize', 'int8'), ['--quantize applies to '
                                              '--format tflite']),
      (tool('export', '--format', 'onnx,pdf'), ['--format=pdf', 'choose']),
      (tool('export', '--format', 'tflite', '--quantize', 'int4'),
       ['--quantize=int4', 'none, float16, dynamic, int8']),
      (tool('validate', '--saved_model', str(tmp_path / 'nowhere.onnx')),
       ['nowhere.onnx does not exist']),
      (tool('validate', '--saved_model', str(tmp_path / 'notes.txt')),
       ['is not a SavedModel directory, an .onnx or a .tflite file']),
      (tool('validate', '--saved_model', str(tmp_path / 'orphan.tflite')),
       ['orphan.tflite.json is missing']),
      (tool('validate', '--checkpoint', 'ckpt-8', '--saved_model',
            os.path.join(out, 'model.onnx')), ['pass one of them']),
      # Another run's export: 10 classes where this run has 6.
      (tool('validate', '--saved_model',
            os.path.join(synthetic_run, contract.CLASSIFIER_DIR)),
       ['to 10 classes', 'images of 6', "export this run's checkpoint"]),
  ]:
    runner.assert_one_line_error(result, *fragments)
