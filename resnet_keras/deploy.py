"""ONNX and LiteRT (TFLite) files of a run's network, and one way to run any
export of it: SavedModel, ONNX or TFLite.

Every file takes what the SavedModel's `serving_uint8` signature takes: RGB
pixels, uint8 0-255, `[N, size, size, 3]` (size: the run's evaluation size),
the mean subtracted inside; and returns `probabilities`, float32
`[N, classes]`. They compute in float32 whatever dtype trained the run
(neither ONNX Runtime nor LiteRT has bf16 convolutions on CPUs), from the
portable copy of the network (export.py): the same standard layers, the
weight average of an --ema_decay run.

Quantisation (TFLite):
  float16  weights stored as float16, computed in float32: half the size.
  dynamic  weights int8 (per channel), activations quantised on the fly.
  int8     weights and activations int8, activation ranges calibrated on
           training images (evaluation preprocessing); the input stays uint8
           pixels (its scale pinned to 1, so pixels go in unchanged) and the
           output float32 probabilities.

What a caller needs besides the tensors travels with the file: the image
size, evaluation crop, class names, checkpoint and step are the ONNX file's
metadata properties, and a JSON file beside a TFLite file (FILE.json).
tf2onnx, onnxruntime and ai-edge-litert are optional packages
(requirements-deploy.txt): without one, the format that needs it is refused
in one line and nothing else changes.
"""

import contextlib
import dataclasses
import importlib
import json
import os
from typing import Dict, Iterable, List, Optional

import numpy as np
import tensorflow as tf
import tf_keras

from common.errors import UsageError
from resnet_keras import metrics
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images

FORMATS = ('saved_model', 'onnx', 'tflite')
QUANTIZATIONS = ('none', 'float16', 'dynamic', 'int8')
INPUT_NAME = 'images'
OUTPUT_NAME = 'probabilities'
ONNX_OPSET = 17
# What the packages are called on PyPI (requirements-deploy.txt pins them).
_PACKAGES = {'tf2onnx': 'tf2onnx', 'onnxruntime': 'onnxruntime',
             'ai_edge_litert.interpreter': 'ai-edge-litert'}


def require(module: str, purpose: str):
  """Imports an optional package's `module`, or refuses in one line."""
  try:
    return importlib.import_module(module)
  except ImportError:
    raise UsageError(
        f'{purpose} needs the {_PACKAGES[module]} package: pip install -r '
        'requirements-deploy.txt') from None


def file_name(fmt: str, quantize: str = 'none') -> str:
  """model.onnx, model.tflite, model_int8.tflite, ..."""
  suffix = '' if quantize == 'none' else f'_{quantize}'
  return f'model{suffix}.{fmt}'


@dataclasses.dataclass(frozen=True)
class Metadata:
  """What travels with an ONNX or TFLite file besides its tensors."""
  image_size: int
  eval_crop_fraction: float
  labels: List[str]
  checkpoint: str = ''
  step: int = -1
  quantize: str = 'none'

  def to_strings(self) -> Dict[str, str]:
    return {'producer': 'resnet_keras',
            'input': f'{INPUT_NAME}: uint8 RGB pixels 0-255, [N, '
                     f'{self.image_size}, {self.image_size}, 3]',
            'output': f'{OUTPUT_NAME}: float32 [N, classes]',
            'image_size': str(self.image_size),
            'eval_crop_fraction': str(self.eval_crop_fraction),
            'labels': '\n'.join(self.labels),
            'checkpoint': self.checkpoint, 'step': str(self.step),
            'quantize': self.quantize}

  @classmethod
  def from_strings(cls, props: Dict[str, str]) -> 'Metadata':
    return cls(image_size=int(props['image_size']),
               eval_crop_fraction=float(props['eval_crop_fraction']),
               labels=props['labels'].split('\n') if props['labels'] else [],
               checkpoint=props['checkpoint'], step=int(props['step']),
               quantize=props['quantize'])


@contextlib.contextmanager
def float32_layers():
  """Layers built inside compute in float32, whatever the run's policy."""
  saved = tf_keras.mixed_precision.global_policy()
  tf_keras.mixed_precision.set_global_policy('float32')
  try:
    yield
  finally:
    tf_keras.mixed_precision.set_global_policy(saved)


def pixel_function(network: tf_keras.Model, image_size: int,
                   quantized_input: bool = False):
  """`network` (float32, on normalised images) as a tf.function on uint8
  pixels returning {OUTPUT_NAME: probabilities}.

  `quantized_input`: for the int8 converter, float32 pixels declared to
  range over 0-255 (which it makes a uint8 input of scale 1, zero point 0:
  the pixels themselves). Calibrated instead, the range would be what the
  representative images happen to span, and a uint8 input of another scale
  would take other values than pixels.
  """
  dtype = tf.float32 if quantized_input else tf.uint8

  @tf.function(input_signature=[tf.TensorSpec(
      [None, image_size, image_size, 3], dtype, name=INPUT_NAME)])
  def probabilities(images):
    pixels = tf.cast(images, tf.float32)
    if quantized_input:
      pixels = tf.quantization.fake_quant_with_min_max_args(
          pixels, min=0.0, max=255.0, num_bits=8)
    return {OUTPUT_NAME: network(normalize_images(pixels), training=False)}

  return probabilities


def to_onnx(network: tf_keras.Model, path: str, meta: Metadata) -> str:
  """Writes `network` (float32) to `path` as ONNX, `meta` in its metadata
  properties."""
  tf2onnx = require('tf2onnx', '--format onnx')
  function = pixel_function(network, meta.image_size)
  proto, _ = tf2onnx.convert.from_function(
      function, input_signature=function.input_signature, opset=ONNX_OPSET)
  for key, value in meta.to_strings().items():
    prop = proto.metadata_props.add()
    prop.key, prop.value = key, value
  metrics.write_bytes_atomically(path, proto.SerializeToString())
  return path


def to_tflite(network: tf_keras.Model, path: str, meta: Metadata,
              representative: Optional[np.ndarray] = None) -> str:
  """Writes `network` (float32) to `path` as TFLite quantised as
  `meta.quantize` says, and `meta` to path.json. int8 needs
  `representative`: uint8 pixels [N, size, size, 3] to calibrate on."""
  int8 = meta.quantize == 'int8'
  function = pixel_function(network, meta.image_size, quantized_input=int8)
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [function.get_concrete_function()], function)
  if meta.quantize != 'none':
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  if meta.quantize == 'float16':
    converter.target_spec.supported_types = [tf.float16]
  if int8:
    if representative is None or not len(representative):
      raise UsageError('--quantize int8 needs training images to calibrate '
                       'on (--representative_images > 0)')
    converter.representative_dataset = lambda: (
        [image[None].astype(np.float32)] for image in representative)
    # Every op int8 (conversion fails rather than leave one in float).
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.uint8
  metrics.write_bytes_atomically(path, converter.convert())
  metrics.write_json_atomically(path + '.json', meta.to_strings())
  return path


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

  def _from_metadata(self, meta: Metadata) -> None:
    self.image_size, self.labels = meta.image_size, meta.labels
    self.step, self._crop_fraction = meta.step, meta.eval_crop_fraction


class _SavedModel(Deployed):
  kind = 'SavedModel'

  def __init__(self, path: str):
    # Imported here: export imports this module.
    from resnet_keras import export  # pylint: disable=g-import-not-at-top
    loaded = tf.saved_model.load(path)
    if export.ENCODED_SIGNATURE not in loaded.signatures:
      raise UsageError(
          f'{path} has no {export.ENCODED_SIGNATURE} signature (exported by '
          'an older version); rerun its training command with '
          '--enable_checkpoint_and_export to export it again')
    self._pixels = loaded.signatures['serving_uint8']
    self._encoded = loaded.signatures[export.ENCODED_SIGNATURE]
    self.image_size = int(
        self._pixels.structured_input_signature[1][INPUT_NAME].shape[1])
    self.num_classes = int(
        self._pixels.structured_outputs[export.CLASSIFIER_OUTPUT].shape[-1])
    self.labels = (imagenet.read_labels(
        loaded.labels.asset_path.numpy().decode())
                   if hasattr(loaded, 'labels') else [])

  def __call__(self, pixels):
    return self._pixels(images=tf.constant(pixels))[OUTPUT_NAME].numpy()

  def predict_encoded(self, images):
    return self._encoded(
        image_bytes=tf.constant(images))[OUTPUT_NAME].numpy()


class _Onnx(Deployed):
  kind = 'ONNX'

  def __init__(self, path: str):
    ort = require('onnxruntime', 'Running an .onnx file')
    self._session = ort.InferenceSession(
        path, providers=['CPUExecutionProvider'])
    self._from_metadata(Metadata.from_strings(
        self._session.get_modelmeta().custom_metadata_map))
    self.num_classes = int(self._session.get_outputs()[0].shape[-1])

  def __call__(self, pixels):
    return self._session.run([OUTPUT_NAME], {INPUT_NAME: pixels})[0]


class _TFLite(Deployed):

  def __init__(self, path: str):
    litert = require('ai_edge_litert.interpreter', 'Running a .tflite file')
    sidecar = path + '.json'
    if not os.path.isfile(sidecar):
      raise UsageError(f'{sidecar} is missing: it holds the image size and '
                       'class names; export the file again')
    with open(sidecar) as f:
      meta = Metadata.from_strings(json.load(f))
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
          'model_dir/saved_model')
    return _SavedModel(path)
  if not os.path.isfile(path):
    raise UsageError(f'{path} does not exist')
  if path.endswith('.onnx'):
    return _Onnx(path)
  if path.endswith('.tflite'):
    return _TFLite(path)
  raise UsageError(f'{path} is not a SavedModel directory, an .onnx or a '
                   '.tflite file')


def stacked(batches: Iterable, count: int) -> np.ndarray:
  """The first `count` images of (images, labels) batches, as one array."""
  images, have = [], 0
  for batch, _ in batches:
    images.append(np.asarray(batch)[:count - have])
    have += len(images[-1])
    if have >= count:
      break
  return np.concatenate(images) if images else np.zeros([0], np.uint8)
