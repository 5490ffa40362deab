"""A run's checkpoints deployed: exported in the formats asked for (the
export tool, resnet_keras/export.py).

Each checkpoint goes to OUTPUT_DIR/<checkpoint name>/: the SavedModel
classifier and feature vector (saved_model.py) and, with --format
onnx,tflite, model.onnx and model[_QUANTISATION].tflite (converters.py).
Each ONNX or TFLite file is checked as it is written: loaded back
(readers.py) and run on the first validation images beside the network it
came from. An --ema_decay run's exports are its weight average, as at the
end of its training.
"""

import dataclasses
import os
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from common.errors import UsageError
from resnet_keras.engine import assembly
from resnet_keras.rundir import checkpoints
from resnet_keras.engine import runtime
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.serving import contract
from resnet_keras.serving import converters
from resnet_keras.serving import readers
from resnet_keras.serving import saved_model

# A file is checked against the network on this many validation images.
CHECK_IMAGES = 32


@dataclasses.dataclass(frozen=True)
class DeployPlan:
  """The ONNX and TFLite files to write, and the images they need."""
  files: Tuple[Tuple[str, str], ...]  # (format, quantisation)
  check_images: np.ndarray  # uint8 [CHECK_IMAGES, size, size, 3]
  representative: Optional[np.ndarray]  # the same, for int8 calibration
  labels: List[str]


def stacked(batches: Iterable, count: int) -> np.ndarray:
  """The first `count` images of (images, labels) batches, as one array."""
  images, have = [], 0
  for batch, _ in batches:
    images.append(np.asarray(batch)[:count - have])
    have += len(images[-1])
    if have >= count:
      break
  return np.concatenate(images) if images else np.zeros([0], np.uint8)


def plan_deployment(cfg: RunConfig, formats: Sequence[str],
                    quantizations: Sequence[str],
                    representative_images: int) -> Optional[DeployPlan]:
  """What --format and --quantize ask beside the SavedModel, with the
  run's images it takes; None for a SavedModel alone."""
  for flag, values, known in (('format', formats, contract.FORMATS),
                              ('quantize', quantizations,
                               contract.QUANTIZATIONS)):
    unknown = [v for v in values if v not in known]
    if unknown or not values:
      raise UsageError(f'--{flag}={",".join(unknown)}: choose from '
                       f'{", ".join(known)}')
  if 'tflite' not in formats and set(quantizations) != {'none'}:
    raise UsageError('--quantize applies to --format tflite (ONNX files '
                     'are float32); add tflite to --format')
  files = tuple((fmt, q) for fmt in contract.FORMATS[1:] if fmt in formats
                for q in (dict.fromkeys(quantizations) if fmt == 'tflite'
                          else ['none']))
  if not files:
    return None
  try:
    info = datasets.describe(cfg)
  except UsageError as e:
    raise UsageError(f'{e} (ONNX and TFLite exports are checked on the '
                     'run\'s validation images: pass --data_dir)') from None
  check = stacked(datasets.pixel_batches(cfg, info, CHECK_IMAGES),
                  CHECK_IMAGES)
  representative = None
  if ('tflite', 'int8') in files:
    representative = stacked(
        datasets.pixel_batches(cfg, info, 64, from_training=True,
                               limit=representative_images),
        representative_images)
  labels_file = datasets.labels_file(cfg)
  return DeployPlan(files, check, representative,
                    imagenet.read_labels(labels_file) if labels_file else [])


def write_deployables(network: tf_keras.Model, cfg: RunConfig,
                      output_dir: str, plan: DeployPlan, checkpoint: str,
                      step: int) -> List[str]:
  """Writes the files `plan` names from `network`'s float32 portable copy,
  each checked against that copy on the plan's validation images; returns
  their paths."""
  with converters.float32_layers():
    copy = saved_model.portable_copy(network, cfg)
  reference = copy(normalize_images(plan.check_images), training=False)
  meta = contract.Metadata(
      image_size=cfg.eval_size,
      eval_crop_fraction=datasets.eval_crop_fraction(cfg),
      labels=plan.labels, checkpoint=checkpoint, step=step)
  written = []
  for fmt, quantize in plan.files:
    path = os.path.join(output_dir, contract.file_name(fmt, quantize))
    file_meta = dataclasses.replace(meta, quantize=quantize)
    if fmt == 'onnx':
      converters.to_onnx(copy, path, file_meta)
    else:
      converters.to_tflite(copy, path, file_meta, plan.representative)
    probs = readers.load(path)(plan.check_images)
    same = int(np.sum(np.argmax(probs, -1) == np.argmax(reference, -1)))
    print(f'wrote {path} ({os.path.getsize(path) / 2**20:.2f} MiB): '
          f'max |p - p_keras| {np.max(np.abs(probs - reference)):.2g}, '
          f'same top-1 on {same}/{len(probs)} validation images')
    written.append(path)
  return written


def export_checkpoints(cfg: RunConfig, which: Optional[str],
                       output_dir: Optional[str] = None,
                       formats: Sequence[str] = ('saved_model',),
                       quantizations: Sequence[str] = ('none',),
                       representative_images: int = 200) -> List[str]:
  """Exports the checkpoints `which` names (one, 'all', or None: the latest)
  of the run `cfg` describes, in `formats`, to output_dir (None: the run's
  exports/); returns the paths written."""
  output_dir = output_dir or os.path.join(cfg.model_dir, contract.EXPORTS_DIR)
  cfg, machine, _ = runtime.configure(cfg)  # No data: config.json has it all.
  plan = plan_deployment(cfg, formats, quantizations, representative_images)
  network, model = assembly.build_model(cfg, cfg.num_classes, machine)
  averaged = assembly.build_ema(cfg, model)
  checkpoint = checkpoints.checkpoint_of(model, ema=averaged)
  manager = tf.train.CheckpointManager(checkpoint, cfg.model_dir,
                                       max_to_keep=None)
  # Checked before anything is made: a --checkpoint the run lacks leaves
  # no empty exports/ behind.
  paths = list(checkpoints.checkpoint_paths(manager, cfg.model_dir, which))
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise UsageError(f'--output_dir={output_dir} cannot be created '
                     f'({e.strerror}); choose a writable directory') from None
  written = []
  for path in paths:
    checkpoints.restore(checkpoint, path, cfg)
    name = os.path.basename(path)
    target = os.path.join(output_dir, name)
    # An --ema_decay run's export is its weight average, as at its end.
    with ema_lib.in_model(averaged):
      if 'saved_model' in formats:
        for exported in saved_model.export_run(network, cfg, target,
                                               feature_vector=True):
          logging.info('exported %s to %s', name, exported)
          written.append(exported)
      if plan:
        os.makedirs(target, exist_ok=True)
        written.extend(write_deployables(network, cfg, target, plan, name,
                                         checkpoints.step_of(path)))
  return written
