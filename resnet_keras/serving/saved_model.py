"""SavedModel exports: a classifier and a feature vector other programs reuse.

Both follow the Reusable SavedModel API (what `hub.KerasLayer(path,
trainable=True)` and TF Hub models use): the loaded object is called as
`obj(images, training=False)` and has `variables`, `trainable_variables` (the
whole network, to fine-tune or freeze) and `regularization_losses` (the run's
weight decay as one L2 term, empty without it), with the serving signatures
of the contract (contract.py). The data's labels.txt, when it has one, goes
into the assets, so predictions can be named anywhere.

What is exported is the network rebuilt from standard layers with the trained
weights (`portable_copy`): native convolutions and ReLUs, per-replica batch
norm, no recomputation, no drop path and nothing frozen, whatever kernels, distribution or
--freeze_backbone trained it. So an export loads without Horovod, runs on
any device, and its `training=True` path has no collective ops. Each export is
written to a temporary directory and swapped in: an existing one is only
replaced by a complete one.
"""

import dataclasses
import os
import shutil
from typing import List, Optional

import tensorflow as tf
import tf_keras

from resnet_keras.model import network as network_lib
from resnet_keras.optimization import optimizers
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.rundir import checkpoints
from resnet_keras.serving import contract


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
          input_signature=[], autograph=False))
    if labels_file:
      self.labels = tf.saved_model.Asset(labels_file)
    self._output_name = output_name
    self._image_size = image_size
    self._crop_fraction = eval_crop_fraction

  def _outputs(self, normalised, training):
    # float32 out also where the network computes in bf16 or fp16.
    return tf.cast(self._network()(normalised, training=training),
                   tf.float32)

  # Every function here is traced with autograph=False: none branches on a
  # tensor, and AutoGraph's conversion was a quarter of a tiny network's
  # first export (1.1 -> 0.85 s of CPU, benchmarks/HISTORY.md).
  @tf.function(autograph=False)
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
        [None, self._image_size, self._image_size, 3], dtype,
        name=contract.INPUT_NAME)
    # Both modes of __call__ are traced: loaders call the one they need.
    for training in (False, True):
      self.__call__.get_concrete_function(spec(tf.float32), training=training)
    # tf.functions, not concrete functions: under a distribution strategy
    # only the former can be saved.
    return {
        contract.FLOAT_SIGNATURE: tf.function(
            self.serve, input_signature=[spec(tf.float32)], autograph=False),
        contract.UINT8_SIGNATURE: tf.function(
            self.serve, input_signature=[spec(tf.uint8)], autograph=False),
        contract.ENCODED_SIGNATURE: tf.function(
            self.serve_encoded, input_signature=[
                tf.TensorSpec([None], tf.string,
                              name=contract.ENCODED_INPUT_NAME)],
            autograph=False),
    }


def feature_extractor(network: tf_keras.Model) -> tf_keras.Model:
  """`network` without its head: the pooled features the head reads."""
  return tf_keras.Model(network.inputs,
                        network.get_layer(network_lib.HEAD_LAYER).input,
                        name=network.name + '_features')


def portable_copy(network: tf_keras.Model, cfg: RunConfig) -> tf_keras.Model:
  """`network` of a run with `cfg` rebuilt from standard layers, its weights
  copied (see the module doc); built outside any distribution strategy."""
  # No drop path either: an export's training=True path (fine-tuning it)
  # runs every residual branch, as evaluation does.
  standard = dataclasses.replace(
      cfg, conv_impl='native', relu_impl='native', sync_batch_norm=False,
      enable_recompute=False, freeze_backbone=False, drop_path_rate=0.0)
  copy = network_lib.build_network(standard, network.output_shape[-1],
                                   use_regularizers=False)
  # Read as a checkpoint holds them: under multi_worker_mirrored the other
  # workers join this read (training/final_export.py).
  copy.set_weights(checkpoints.values(network.weights))
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
  paths = [export_saved_model(
      copy, os.path.join(output_dir, contract.CLASSIFIER_DIR),
      contract.CLASSIFIER_OUTPUT, **common)]
  if feature_vector:
    common['labels_file'] = None  # Features have no classes.
    paths.append(export_saved_model(
        feature_extractor(copy),
        os.path.join(output_dir, contract.FEATURE_VECTOR_DIR),
        contract.FEATURE_VECTOR_OUTPUT, **common))
  return paths
