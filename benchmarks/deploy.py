"""Latency and size of each deployable file of a run: SavedModel, ONNX
Runtime, LiteRT float32 / float16 / dynamic / int8, and OpenVINO reading the
ONNX file (when `pip install openvino` has put it there).

  # a run's exports (python -m resnet_keras.export --format
  #   saved_model,onnx,tflite --quantize none,float16,dynamic,int8):
  python -m benchmarks.deploy --exports_dir MODEL_DIR/exports/ckpt-N
  # ResNet-50 at 224 px, random weights, exported here first:
  python -m benchmarks.deploy --resnet50 --work_dir /tmp/r50

Each file is called on uint8 pixels at batch 1 and 32: warm-up calls, then
the median of --calls calls (wall time, on every core the process may use).
The same pixels go to each, and the table says how far each file's
probabilities are from the SavedModel's on them.
"""

import argparse
import os
import statistics
import time

import numpy as np


from benchmarks import hardware
from common import cli
from resnet_keras.serving import contract
from resnet_keras.serving import deployment
from resnet_keras.serving import readers
from resnet_keras.serving import saved_model

FILES = [contract.CLASSIFIER_DIR, 'model.onnx'] + [
    contract.file_name('tflite', q) for q in contract.QUANTIZATIONS]
BATCHES = (1, 32)


class OpenVino:
  """The ONNX file compiled by OpenVINO for this CPU: in float32, or at its
  default precision (bf16 where the CPU has bf16 instructions)."""

  def __init__(self, path, float32: bool):
    import openvino  # pylint: disable=g-import-not-at-top
    config = {'INFERENCE_PRECISION_HINT': 'f32'} if float32 else {}
    self._model = openvino.Core().compile_model(path, 'CPU', config)
    self.kind = 'OpenVINO f32' if float32 else 'OpenVINO default'

  def __call__(self, pixels):
    return self._model(pixels)[0]


def size_mib(path: str) -> float:
  if os.path.isdir(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files) / 2**20
  return os.path.getsize(path) / 2**20


def median_ms(model, pixels, calls: int) -> float:
  for _ in range(3):
    model(pixels)
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    model(pixels)
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def resnet50_exports(work_dir: str) -> str:
  """ResNet-50 (random weights, 1000 classes, 224 px) in every format."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  from resnet_keras.model import network as network_lib  # pylint: disable=g-import-not-at-top
  from resnet_keras.config import RunConfig  # pylint: disable=g-import-not-at-top
  tf_keras.utils.set_random_seed(0)
  cfg = RunConfig(resnet_depth=50, image_size=224, dtype='fp32')
  network = network_lib.build_network(cfg, 1000, use_regularizers=False)
  # Natural-looking statistics are not needed for timing; a smooth random
  # field keeps int8 calibration from seeing only noise.
  rng = np.random.RandomState(0)
  coarse = rng.randint(0, 256, (64, 14, 14, 3)).astype(np.float32)
  images = tf.cast(tf.image.resize(coarse, [224, 224]), tf.uint8).numpy()
  saved_model.export_run(network, cfg, work_dir)
  plan = deployment.DeployPlan(
      files=(('onnx', 'none'),) + tuple(('tflite', q)
                                         for q in contract.QUANTIZATIONS),
      check_images=images[:8], representative=images, labels=[])
  deployment.write_deployables(network, cfg, work_dir, plan, 'random', 0)
  return work_dir


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--exports_dir')
  parser.add_argument('--resnet50', action='store_true')
  parser.add_argument('--work_dir', default='/tmp/deploy_benchmark_r50')
  parser.add_argument('--calls', type=int, default=30)
  args = parser.parse_args()
  if not (args.resnet50 or args.exports_dir):
    cli.fail('give --exports_dir MODEL_DIR/exports/ckpt-N (a run\'s exports, '
             'written by python -m resnet_keras.export) or --resnet50')
  print(hardware.machine_line())
  exports_dir = (resnet50_exports(args.work_dir) if args.resnet50
                 else args.exports_dir)
  paths = [os.path.join(exports_dir, name) for name in FILES]
  models = [(p, readers.load(p)) for p in paths if os.path.exists(p)]
  if not models:
    cli.fail(f'no exported model in --exports_dir={exports_dir} (looked for '
             f'{", ".join(FILES)}): export a run with python -m '
             'resnet_keras.export')
  onnx_file = os.path.join(exports_dir, 'model.onnx')
  try:
    models += [(onnx_file, OpenVino(onnx_file, f32)) for f32 in (True, False)]
  except ImportError:
    print('(OpenVINO not installed: pip install openvino for its row)')
  size = models[0][1].image_size
  rng = np.random.RandomState(1)
  pixels = {b: rng.randint(0, 256, (b, size, size, 3), np.uint8)
            for b in BATCHES}
  reference = models[0][1](pixels[BATCHES[0]])
  print(f'{"file":<22} {"runtime":<16} {"MiB":>7} {"batch 1 ms":>11} '
        f'{"batch 32 ms":>12} {"img/s @32":>10} {"max |dp|":>9}')
  for path, model in models:
    ms = {b: median_ms(model, pixels[b],
                       args.calls if b == 1 else max(5, args.calls // 3))
          for b in BATCHES}
    diff = np.max(np.abs(model(pixels[BATCHES[0]]) - reference))
    print(f'{os.path.basename(path):<22} {model.kind:<16} '
          f'{size_mib(path):>7.2f} {ms[1]:>11.2f} {ms[32]:>12.1f} '
          f'{32e3 / ms[32]:>10.0f} {diff:>9.2g}', flush=True)


if __name__ == '__main__':
  main()
