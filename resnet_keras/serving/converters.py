"""ONNX and LiteRT (TFLite) files of a run's network.

Each file takes uint8 pixels and returns probabilities (contract.py). They
compute in float32 whatever dtype trained the run (neither ONNX Runtime nor
LiteRT has bf16 convolutions on CPUs), from the portable copy of the network
(saved_model.portable_copy: the same standard layers, the weight average of
an --ema_decay run), built under `float32_layers`. tf2onnx is optional
(requirements-deploy.txt): without it, --format onnx is refused in one line.
"""

import contextlib
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras

from resnet_keras import files
from common.errors import UsageError
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.serving import contract


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
  pixels returning {CLASSIFIER_OUTPUT: probabilities}.

  `quantized_input`: for the int8 converter, float32 pixels declared to
  range over 0-255 (which it makes a uint8 input of scale 1, zero point 0:
  the pixels themselves). Calibrated instead, the range would be what the
  representative images happen to span, and a uint8 input of another scale
  would take other values than pixels.
  """
  dtype = tf.float32 if quantized_input else tf.uint8

  @tf.function(input_signature=[tf.TensorSpec(
      [None, image_size, image_size, 3], dtype, name=contract.INPUT_NAME)])
  def probabilities(images):
    pixels = tf.cast(images, tf.float32)
    if quantized_input:
      pixels = tf.quantization.fake_quant_with_min_max_args(
          pixels, min=0.0, max=255.0, num_bits=8)
    return {contract.CLASSIFIER_OUTPUT: network(normalize_images(pixels),
                                                training=False)}

  return probabilities


def to_onnx(network: tf_keras.Model, path: str,
            meta: contract.Metadata) -> str:
  """Writes `network` (float32) to `path` as ONNX, `meta` in its metadata
  properties."""
  tf2onnx = contract.require('tf2onnx', '--format onnx')
  function = pixel_function(network, meta.image_size)
  proto, _ = tf2onnx.convert.from_function(
      function, input_signature=function.input_signature,
      opset=contract.ONNX_OPSET)
  for key, value in meta.to_strings().items():
    prop = proto.metadata_props.add()
    prop.key, prop.value = key, value
  files.write_bytes_atomically(path, proto.SerializeToString())
  return path


def to_tflite(network: tf_keras.Model, path: str, meta: contract.Metadata,
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
  files.write_bytes_atomically(path, converter.convert())
  files.write_json_atomically(path + '.json', meta.to_strings())
  return path
