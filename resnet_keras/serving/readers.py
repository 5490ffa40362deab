"""Any export of a run, loaded back: a SavedModel directory, an .onnx or a
.tflite file, as one `Deployed` that gives probabilities of uint8 pixels or
of encoded image files, with its image size and class names (contract.py).
onnxruntime and ai-edge-litert are optional (requirements-deploy.txt):
without one, the format that needs it is refused in one line.
"""

import json
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from common.errors import UsageError
from resnet_keras.files import kind_of
from resnet_keras.engine import evaluator
from resnet_keras.data import imagenet
from resnet_keras.serving import contract


class Deployed:
  """An export of any format: probabilities of uint8 pixels or of encoded
  images, its image size and class names."""

  kind: str  # For tables: 'SavedModel', 'ONNX', 'TFLite int8', ...
  image_size: int
  num_classes: int
  labels: List[str]
  step: int = -1  # Of the checkpoint exported; -1: not recorded.
  _crop_fraction: float = imagenet.DEFAULT_EVAL_CROP_FRACTION

  def __call__(self, pixels: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def predict_encoded(self, images: List[bytes]) -> np.ndarray:
    """Probabilities of JPEG/PNG files, preprocessed as evaluation does."""
    return self(np.stack([imagenet.preprocess_eval(
        image, self.image_size, tf.uint8, self._crop_fraction).numpy()
                          for image in images]))

  def _from_metadata(self, meta: contract.Metadata) -> None:
    self.image_size, self.labels = meta.image_size, meta.labels
    self.step, self._crop_fraction = meta.step, meta.eval_crop_fraction


class _SavedModel(Deployed):
  kind = 'SavedModel'

  def __init__(self, path: str):
    loaded = tf.saved_model.load(path)
    if contract.ENCODED_SIGNATURE not in loaded.signatures:
      raise UsageError(
          f'{path} has no {contract.ENCODED_SIGNATURE} signature (exported '
          'by an older version); rerun its training command with '
          '--enable_checkpoint_and_export to export it again')
    self._pixels = loaded.signatures[contract.UINT8_SIGNATURE]
    self._encoded = loaded.signatures[contract.ENCODED_SIGNATURE]
    if contract.CLASSIFIER_OUTPUT not in self._pixels.structured_outputs:
      # A feature vector (the export tool's --feature_vector): features
      # have no classes to rank.
      classifier = os.path.join(os.path.dirname(os.path.normpath(path)),
                                contract.CLASSIFIER_DIR)
      raise UsageError(
          f'{path} returns {", ".join(self._pixels.structured_outputs)}, '
          f'not {contract.CLASSIFIER_OUTPUT}: it is a feature vector, not a '
          f'classifier; give the classifier exported beside it ({classifier})')
    self.image_size = int(self._pixels.structured_input_signature[1][
        contract.INPUT_NAME].shape[1])
    self.num_classes = int(self._pixels.structured_outputs[
        contract.CLASSIFIER_OUTPUT].shape[-1])
    self.labels = (imagenet.read_labels(
        loaded.labels.asset_path.numpy().decode())
                   if hasattr(loaded, 'labels') else [])

  def __call__(self, pixels):
    return self._pixels(**{contract.INPUT_NAME: tf.constant(pixels)})[
        contract.CLASSIFIER_OUTPUT].numpy()

  def predict_encoded(self, images):
    return self._encoded(**{contract.ENCODED_INPUT_NAME: tf.constant(
        images)})[contract.CLASSIFIER_OUTPUT].numpy()


class _Onnx(Deployed):
  kind = 'ONNX'

  def __init__(self, path: str):
    ort = contract.require('onnxruntime', 'Running an .onnx file')
    self._session = ort.InferenceSession(
        path, providers=['CPUExecutionProvider'])
    self._from_metadata(contract.Metadata.from_strings(
        self._session.get_modelmeta().custom_metadata_map))
    self.num_classes = int(self._session.get_outputs()[0].shape[-1])

  def __call__(self, pixels):
    return self._session.run([contract.CLASSIFIER_OUTPUT],
                             {contract.INPUT_NAME: pixels})[0]


class _TFLite(Deployed):

  def __init__(self, path: str):
    litert = contract.require('ai_edge_litert.interpreter',
                              'Running a .tflite file')
    sidecar = path + '.json'
    if not os.path.isfile(sidecar):
      raise UsageError(f'{sidecar} is missing: it holds the image size and '
                       'class names; export the file again')
    with open(sidecar) as f:
      meta = contract.Metadata.from_strings(json.load(f))
    self._from_metadata(meta)
    self.kind = 'TFLite' + ('' if meta.quantize == 'none'
                            else f' {meta.quantize}')
    self._interpreter = litert.Interpreter(
        model_path=path, num_threads=len(os.sched_getaffinity(0)))
    self._input = self._interpreter.get_input_details()[0]['index']
    output = self._interpreter.get_output_details()[0]
    self._output = output['index']
    self.num_classes = int(output['shape'][-1])
    self._batch = None

  def __call__(self, pixels):
    if self._batch != len(pixels):  # The file's batch dimension is free.
      self._interpreter.resize_tensor_input(self._input, pixels.shape)
      self._interpreter.allocate_tensors()
      self._batch = len(pixels)
    self._interpreter.set_tensor(self._input, pixels)
    self._interpreter.invoke()
    return self._interpreter.get_tensor(self._output).copy()


def load(path: str) -> Deployed:
  """The export at `path`: a SavedModel directory, an .onnx or a .tflite
  file."""
  if os.path.isdir(path):
    if not os.path.isfile(os.path.join(path, 'saved_model.pb')):
      raise UsageError(
          f'{path} is not a SavedModel (no saved_model.pb); training with '
          '--enable_checkpoint_and_export exports one to '
          f'model_dir/{contract.CLASSIFIER_DIR}')
    return _SavedModel(path)
  if not os.path.isfile(path):
    raise UsageError(f'{path} {kind_of(path)}; give a SavedModel '
                     'directory, an .onnx or a .tflite file')
  if path.endswith('.onnx'):
    return _Onnx(path)
  if path.endswith('.tflite'):
    return _TFLite(path)
  raise UsageError(f'{path} is not a SavedModel directory, an .onnx or a '
                   '.tflite file')


def mirrored(encoded: bytes) -> bytes:
  """The image mirrored left to right, as a (lossless) PNG. The signature's
  resize and central crop are symmetric, so it preprocesses this into the
  mirror of what it makes of the image."""
  pixels = tf.io.decode_image(encoded, expand_animations=False)
  return tf.io.encode_png(tf.image.flip_left_right(pixels)).numpy()


def probabilities_of(model: Deployed, encoded: bytes,
                     flip: bool) -> np.ndarray:
  """The model's probabilities for one encoded image (flip-averaged)."""
  views = [encoded, mirrored(encoded)] if flip else [encoded]
  probs = model.predict_encoded(views)
  if flip:
    return evaluator.flip_average(probs[0], probs[1]).numpy()
  return probs[0]


def class_names(labels: List[str], labels_file: Optional[str],
                num_classes: int) -> List[str]:
  """A name per model output: from labels_file (--labels), else the
  export's `labels`, the rest as indices."""
  if labels_file:
    if not os.path.isfile(labels_file):
      raise UsageError(f'--labels={labels_file} {kind_of(labels_file)}'
                       '; give a file of class names, one per line')
    labels = imagenet.read_labels(labels_file)
  if len(labels) > num_classes:
    raise UsageError(f'{labels_file or "the export"} names {len(labels)} '
                     f'classes but the model has {num_classes}; pass its '
                     'training data\'s labels.txt with --labels')
  # A model may have more outputs than its data had classes (--num_classes).
  return list(labels) + [f'class {i}' for i in range(len(labels), num_classes)]


def top_classes(export: str, files: Sequence[str], labels_file: Optional[str],
                flip: bool, k: int) -> Iterator[Tuple[str, List]]:
  """(file, its `k` most likely (probability, class name)) for each image
  file, by the export at `export` (load), one file at a time (the predict
  tool's answer)."""
  model = load(export)
  names = class_names(model.labels, labels_file, model.num_classes)
  for path in files:
    with open(path, 'rb') as f:
      encoded = f.read()
    try:  # One image per call, so an undecodable file is named.
      probabilities = probabilities_of(model, encoded, flip)
    except tf.errors.InvalidArgumentError:
      raise UsageError(f'{path} is not a JPEG or PNG image') from None
    yield path, [(probabilities[i], names[i]) for i in
                 np.argsort(-probabilities, kind='stable')[:k]]
