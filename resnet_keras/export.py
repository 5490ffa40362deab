"""SavedModel exports: a classifier and a feature vector other programs reuse.

  python -m resnet_keras.export --model_dir DIR                 # the latest
  python -m resnet_keras.export --model_dir DIR --checkpoint ckpt-4

Training with --enable_checkpoint_and_export writes DIR/saved_model, the
classifier, at its end. This tool exports any checkpoint a run kept, without
retraining, to DIR/exports/<checkpoint>/ (--output_dir): the classifier in
saved_model/ and the pooled features without the head (2048 values per image
for ResNet-50) in feature_vector/.

Both follow the Reusable SavedModel API (what `hub.KerasLayer(path,
trainable=True)` and TF Hub models use): the loaded object is called as
`obj(images, training=False)` and has `variables`, `trainable_variables` (the
whole network, to fine-tune or freeze) and `regularization_losses` (the run's
weight decay as one L2 term, empty without it). Images are RGB pixels in
0-255, `[N, size, size, 3]` float32 (size: the run's evaluation size,
--eval_image_size or --image_size), everywhere: the mean the
model was trained with is subtracted inside, so no caller needs to know it.

Serving signatures, the same pixels as uint8 (`serving_uint8`) or float32
(`serving_default`), or encoded JPEG/PNG files of any size (`serving_encoded`:
the run's evaluation resize and central crop), return `probabilities` from
the classifier and `features` from the feature vector. The data's labels.txt,
when it has one, goes into the assets, so predictions can be named anywhere.

What is exported is the network rebuilt from standard layers with the trained
weights: native convolutions and ReLUs, per-replica batch norm, no
recomputation and nothing frozen, whatever kernels, distribution or
--freeze_backbone trained it. So an export loads without Horovod, runs on
any device, and its `training=True` path has no collective ops. Each export is
written to a temporary directory and swapped in: an existing one is only
replaced by a complete one.

For serving elsewhere, --format onnx,tflite writes model.onnx and
model[_QUANTISATION].tflite beside them (deploy.py: uint8 pixels in,
probabilities out, float32 or quantised with --quantize), and checks each
file against the network on the first validation images as it writes it:

  python -m resnet_keras.export --model_dir DIR --format onnx,tflite \
      --quantize none,float16,dynamic,int8
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import dataclasses
import os
import shutil
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import flags
from absl import logging

from common import cli
from resnet_keras import assembly
from resnet_keras import checkpoints
from resnet_keras import deploy
from resnet_keras import models
from resnet_keras import optimizers
from resnet_keras import runtime
from resnet_keras import weight_average
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images
from common.errors import UsageError
# pylint: enable=g-import-not-at-top

CLASSIFIER_DIR = 'saved_model'
FEATURE_VECTOR_DIR = 'feature_vector'
EXPORTS_DIR = 'exports'
ENCODED_SIGNATURE = 'serving_encoded'
CLASSIFIER_OUTPUT = 'probabilities'
FEATURE_VECTOR_OUTPUT = 'features'


class _Reusable(tf.train.Checkpoint):
  """`network` on 0-255 pixels, as a Reusable SavedModel with signatures.

  A tf.train.Checkpoint rather than a tf.Module: the Reusable SavedModel API
  needs plain `variables` and `trainable_variables` attributes, which
  tf.Module reserves for properties that are not saved.
  """

  def __init__(self, network: tf_keras.Model, output_name: str,
               image_size: int, eval_crop_fraction: float,
               labels_file: Optional[str], weight_decay: float):
    super().__init__()
    # Held in a closure, out of the saved object graph: as an attribute the
    # Keras model would be serialised layer by layer (each layer's call
    # traced again), 2-3x the cost of the whole export, for objects no
    # loader of this API reads. Its variables are saved through the lists
    # below, which the traced functions capture.
    self._network = lambda: network
    self.variables = list(network.variables)
    self.trainable_variables = list(network.trainable_variables)
    self.regularization_losses = []
    if weight_decay:
      self.regularization_losses.append(tf.function(
          lambda: optimizers.single_l2_loss(network.trainable_variables,
                                            weight_decay),
          input_signature=[]))
    if labels_file:
      self.labels = tf.saved_model.Asset(labels_file)
    self._output_name = output_name
    self._image_size = image_size
    self._crop_fraction = eval_crop_fraction

  def _outputs(self, normalised, training):
    # float32 out also where the network computes in bf16 or fp16.
    return tf.cast(self._network()(normalised, training=training),
                   tf.float32)

  @tf.function
  def __call__(self, images, training=False):
    return self._outputs(normalize_images(images), training)

  def serve(self, images):
    return {self._output_name: self._outputs(normalize_images(images),
                                             training=False)}

  def serve_encoded(self, image_bytes):
    normalised = tf.map_fn(
        lambda b: imagenet.preprocess_eval(b, self._image_size, tf.float32,
                                           self._crop_fraction),
        image_bytes, fn_output_signature=tf.float32)
    return {self._output_name: self._outputs(normalised, training=False)}

  def signatures(self):
    spec = lambda dtype: tf.TensorSpec(
        [None, self._image_size, self._image_size, 3], dtype, name='images')
    # Both modes of __call__ are traced: loaders call the one they need.
    for training in (False, True):
      self.__call__.get_concrete_function(spec(tf.float32), training=training)
    # tf.functions, not concrete functions: under a distribution strategy
    # only the former can be saved.
    return {
        'serving_default': tf.function(
            self.serve, input_signature=[spec(tf.float32)]),
        'serving_uint8': tf.function(
            self.serve, input_signature=[spec(tf.uint8)]),
        ENCODED_SIGNATURE: tf.function(
            self.serve_encoded, input_signature=[
                tf.TensorSpec([None], tf.string, name='image_bytes')]),
    }


def feature_extractor(network: tf_keras.Model) -> tf_keras.Model:
  """`network` without its head: the pooled features the head reads."""
  return tf_keras.Model(network.inputs,
                        network.get_layer(models.HEAD_LAYER).input,
                        name=network.name + '_features')


def portable_copy(network: tf_keras.Model, cfg: RunConfig) -> tf_keras.Model:
  """`network` of a run with `cfg` rebuilt from standard layers, its weights
  copied (see the module doc); built outside any distribution strategy."""
  standard = dataclasses.replace(
      cfg, conv_impl='native', relu_impl='native', sync_batch_norm=False,
      enable_recompute=False, freeze_backbone=False)
  copy = models.build_network(standard, network.output_shape[-1],
                              use_regularizers=False)
  copy.set_weights(network.get_weights())
  return copy


def export_saved_model(network: tf_keras.Model, export_dir: str,
                       output_name: str, image_size: int,
                       eval_crop_fraction: float,
                       labels_file: Optional[str] = None,
                       weight_decay: float = 0.0) -> str:
  """Writes `network` (on normalised images) to `export_dir` as a Reusable
  SavedModel whose signatures return `output_name`; replaces an old one."""
  module = _Reusable(network, output_name, image_size, eval_crop_fraction,
                     labels_file, weight_decay)
  staging = export_dir + '.partial'
  shutil.rmtree(staging, ignore_errors=True)
  tf.saved_model.save(module, staging, signatures=module.signatures())
  previous = export_dir + '.previous'
  if os.path.exists(export_dir):
    shutil.rmtree(previous, ignore_errors=True)
    os.replace(export_dir, previous)
  os.replace(staging, export_dir)
  shutil.rmtree(previous, ignore_errors=True)
  return export_dir


def export_run(network: tf_keras.Model, cfg: RunConfig, output_dir: str,
               feature_vector: bool = False) -> List[str]:
  """Exports a run's trained `network`, through one portable_copy, to
  output_dir/saved_model (and, with `feature_vector`,
  output_dir/feature_vector); returns the paths."""
  copy = portable_copy(network, cfg)
  common = dict(image_size=cfg.eval_size,
                eval_crop_fraction=datasets.eval_crop_fraction(cfg),
                labels_file=datasets.labels_file(cfg),
                weight_decay=cfg.weight_decay)
  paths = [export_saved_model(copy, os.path.join(output_dir, CLASSIFIER_DIR),
                              CLASSIFIER_OUTPUT, **common)]
  if feature_vector:
    common['labels_file'] = None  # Features have no classes.
    paths.append(export_saved_model(
        feature_extractor(copy), os.path.join(output_dir, FEATURE_VECTOR_DIR),
        FEATURE_VECTOR_OUTPUT, **common))
  return paths


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  flags.DEFINE_string('checkpoint', None,
                      'The checkpoint to export (a path, or a name in '
                      '--model_dir such as ckpt-4), or "all" for every '
                      'checkpoint kept; default: the latest.',
                      flag_values=values)
  flags.DEFINE_string('output_dir', None,
                      'Each checkpoint goes to OUTPUT_DIR/<checkpoint name>/'
                      '{saved_model,feature_vector,model.onnx,...}; default: '
                      'MODEL_DIR/exports.',
                      flag_values=values)
  flags.DEFINE_list('format', ['saved_model'],
                    'What to write, comma-separated: saved_model (the '
                    'classifier and the feature vector), onnx (model.onnx), '
                    'tflite (model[_QUANTIZE].tflite).',
                    flag_values=values)
  flags.DEFINE_list('quantize', ['none'],
                    'TFLite files to write, one per value: none (float32), '
                    'float16 (weights), dynamic (int8 weights), int8 (int8 '
                    'weights and activations, calibrated).',
                    flag_values=values)
  flags.DEFINE_integer('representative_images', 200,
                       '--quantize int8 calibrates its activation ranges on '
                       'this many training images.',
                       flag_values=values, lower_bound=1)
  flags.DEFINE_string('data_dir', None,
                      'Read the run\'s data here instead of its data_dir '
                      '(ONNX and TFLite exports are checked on its validation '
                      'images; int8 calibrates on its training images).',
                      flag_values=values)


# A file is checked against the network on this many validation images.
CHECK_IMAGES = 32


@dataclasses.dataclass(frozen=True)
class DeployPlan:
  """The ONNX and TFLite files to write, and the images they need."""
  files: Tuple[Tuple[str, str], ...]  # (format, quantisation)
  check_images: np.ndarray  # uint8 [CHECK_IMAGES, size, size, 3]
  representative: Optional[np.ndarray]  # the same, for int8 calibration
  labels: List[str]


def plan_deployment(cfg: RunConfig, formats: Sequence[str],
                    quantizations: Sequence[str],
                    representative_images: int) -> Optional[DeployPlan]:
  """What --format and --quantize ask beside the SavedModel, with the
  run's images it takes; None for a SavedModel alone."""
  for flag, values, known in (('format', formats, deploy.FORMATS),
                              ('quantize', quantizations,
                               deploy.QUANTIZATIONS)):
    unknown = [v for v in values if v not in known]
    if unknown or not values:
      raise UsageError(f'--{flag}={",".join(unknown)}: choose from '
                       f'{", ".join(known)}')
  if 'tflite' not in formats and set(quantizations) != {'none'}:
    raise UsageError('--quantize applies to --format tflite (ONNX files '
                     'are float32); add tflite to --format')
  files = tuple((fmt, q) for fmt in deploy.FORMATS[1:] if fmt in formats
                for q in (dict.fromkeys(quantizations) if fmt == 'tflite'
                          else ['none']))
  if not files:
    return None
  try:
    info = datasets.describe(cfg)
  except UsageError as e:
    raise UsageError(f'{e} (ONNX and TFLite exports are checked on the '
                     'run\'s validation images: pass --data_dir)') from None
  check = deploy.stacked(datasets.pixel_batches(cfg, info, CHECK_IMAGES),
                         CHECK_IMAGES)
  representative = None
  if ('tflite', 'int8') in files:
    representative = deploy.stacked(
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
  with deploy.float32_layers():
    copy = portable_copy(network, cfg)
  reference = copy(normalize_images(plan.check_images), training=False)
  meta = deploy.Metadata(image_size=cfg.eval_size,
                         eval_crop_fraction=datasets.eval_crop_fraction(cfg),
                         labels=plan.labels, checkpoint=checkpoint, step=step)
  written = []
  for fmt, quantize in plan.files:
    path = os.path.join(output_dir, deploy.file_name(fmt, quantize))
    file_meta = dataclasses.replace(meta, quantize=quantize)
    if fmt == 'onnx':
      deploy.to_onnx(copy, path, file_meta)
    else:
      deploy.to_tflite(copy, path, file_meta, plan.representative)
    probs = deploy.load(path)(plan.check_images)
    same = int(np.sum(np.argmax(probs, -1) == np.argmax(reference, -1)))
    print(f'wrote {path} ({os.path.getsize(path) / 2**20:.2f} MiB): '
          f'max |p - p_keras| {np.max(np.abs(probs - reference)):.2g}, '
          f'same top-1 on {same}/{len(probs)} validation images')
    written.append(path)
  return written


def export_checkpoints(cfg: RunConfig, which: Optional[str],
                       output_dir: str,
                       formats: Sequence[str] = ('saved_model',),
                       quantizations: Sequence[str] = ('none',),
                       representative_images: int = 200) -> List[str]:
  """Exports the checkpoints `which` names (see --checkpoint) of the run
  `cfg` describes, in `formats` (see --format); returns the paths
  written."""
  cfg, machine, _ = runtime.set_up(cfg)  # No data: config.json has it all.
  plan = plan_deployment(cfg, formats, quantizations, representative_images)
  network, model = assembly.build_model(cfg, cfg.num_classes, machine)
  averaged = assembly.build_weight_average(cfg, model)
  checkpoint = checkpoints.checkpoint_of(model, weight_average=averaged)
  manager = tf.train.CheckpointManager(checkpoint, cfg.model_dir,
                                       max_to_keep=None)
  written = []
  for path in checkpoints.checkpoint_paths(manager, cfg.model_dir, which):
    checkpoints.restore(checkpoint, path, cfg)
    name = os.path.basename(path)
    target = os.path.join(output_dir, name)
    # An --ema_decay run's export is its weight average, as at its end.
    with weight_average.in_model(averaged):
      if 'saved_model' in formats:
        for exported in export_run(network, cfg, target, feature_vector=True):
          logging.info('exported %s to %s', name, exported)
          written.append(exported)
      if plan:
        os.makedirs(target, exist_ok=True)
        written.extend(write_deployables(network, cfg, target, plan, name,
                                         checkpoints.step_of(path)))
  return written


def main(argv):
  model_dir = cli.start_tool(argv, flags.FLAGS.model_dir)
  cfg, _ = checkpoints.read_config(model_dir)
  if flags.FLAGS.data_dir:
    cfg = dataclasses.replace(cfg, data_dir=flags.FLAGS.data_dir,
                              use_synthetic_data=False)
  output_dir = flags.FLAGS.output_dir or os.path.join(model_dir, EXPORTS_DIR)
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise UsageError(f'--output_dir={output_dir} cannot be created '
                     f'({e.strerror}); choose a writable directory') from None
  for path in export_checkpoints(cfg, flags.FLAGS.checkpoint, output_dir,
                                 flags.FLAGS.format, flags.FLAGS.quantize,
                                 flags.FLAGS.representative_images):
    if os.path.isdir(path):
      print(f'exported {path}')


if __name__ == '__main__':
  cli.run_entry_point(main, define_flags)
