"""The serving contract: what every export of a run takes and returns, what
its files are called and what travels with them. Each name is defined here
once; the writers (saved_model.py, converters.py) and the readers
(readers.py) follow it.

Every export takes RGB pixels in 0-255, `[N, size, size, 3]` (size: the
run's evaluation size, --eval_image_size or --image_size), the mean the
model was trained with subtracted inside, and returns `probabilities`,
float32 `[N, classes]` (`features` from a feature vector). A SavedModel
takes them as float32 (`serving_default`), uint8 (`serving_uint8`), or
encoded JPEG/PNG files of any size (`serving_encoded`: the run's evaluation
resize and central crop); ONNX and TFLite files take uint8 pixels. What a
caller needs besides the tensors (image size, evaluation crop, class names,
checkpoint, step, quantisation) is a SavedModel's labels.txt asset, an ONNX
file's metadata properties, and a JSON file beside a TFLite file.

Quantisation (TFLite):
  float16  weights stored as float16, computed in float32: half the size.
  dynamic  weights int8 (per channel), activations quantised on the fly.
  int8     weights and activations int8, activation ranges calibrated on
           training images (evaluation preprocessing); the input stays uint8
           pixels (its scale pinned to 1, so pixels go in unchanged) and the
           output float32 probabilities.
"""

import dataclasses
import importlib
from typing import Dict, List

from common.errors import UsageError
from resnet_keras.rundir import run_directory

FORMATS = ('saved_model', 'onnx', 'tflite')
QUANTIZATIONS = ('none', 'float16', 'dynamic', 'int8')

# Tensors.
INPUT_NAME = 'images'  # pixels
ENCODED_INPUT_NAME = 'image_bytes'  # JPEG/PNG files
CLASSIFIER_OUTPUT = 'probabilities'
FEATURE_VECTOR_OUTPUT = 'features'
# SavedModel signatures.
FLOAT_SIGNATURE = 'serving_default'
UINT8_SIGNATURE = 'serving_uint8'
ENCODED_SIGNATURE = 'serving_encoded'
# Directories: training's export in model_dir, and the export tool's.
CLASSIFIER_DIR = run_directory.SAVED_MODEL_DIR
FEATURE_VECTOR_DIR = 'feature_vector'
EXPORTS_DIR = run_directory.EXPORTS_DIR
ONNX_OPSET = 17
# What the optional packages are called on PyPI (requirements-deploy.txt
# pins them), by the module each format needs.
_PACKAGES = {'tf2onnx': 'tf2onnx', 'onnxruntime': 'onnxruntime',
             'ai_edge_litert.interpreter': 'ai-edge-litert'}


def file_name(fmt: str, quantize: str = 'none') -> str:
  """model.onnx, model.tflite, model_int8.tflite, ..."""
  suffix = '' if quantize == 'none' else f'_{quantize}'
  return f'model{suffix}.{fmt}'


def require(module: str, purpose: str):
  """Imports an optional package's `module`, or refuses in one line: without
  one, the format that needs it is refused and nothing else changes."""
  try:
    return importlib.import_module(module)
  except ImportError:
    raise UsageError(
        f'{purpose} needs the {_PACKAGES[module]} package: pip install -r '
        'requirements-deploy.txt') from None


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
            'output': f'{CLASSIFIER_OUTPUT}: float32 [N, classes]',
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
