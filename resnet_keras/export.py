"""SavedModel export with preprocessing inside the serving signatures.

Clients send RGB pixels in 0-255, `[N, image_size, image_size, 3]`, as uint8
(`serving_uint8`) or float32 (`serving_default`), or encoded JPEG/PNG files
of any size (`serving_encoded`: the run's evaluation resize and central
crop), and get class probabilities; they never need to know the mean the
model was trained with. The data's labels.txt, when it has one, goes into the
SavedModel's assets, so predictions can be named anywhere. The export is
written to a temporary directory and swapped in, so an existing export is only
replaced by a complete one.
"""

import os
import shutil
from typing import Optional

import tensorflow as tf
import tf_keras

from resnet_keras.data import imagenet
from resnet_keras.data.preprocessing import normalize_images

ENCODED_SIGNATURE = 'serving_encoded'


class _Serving(tf.Module):

  def __init__(self, network: tf_keras.Model, image_size: int,
               eval_crop_fraction: float, labels_file: Optional[str]):
    super().__init__()
    self.network = network
    self._image_size = image_size
    self._crop_fraction = eval_crop_fraction
    if labels_file:
      self.labels = tf.saved_model.Asset(labels_file)

  def predict(self, images):
    return {'probabilities': self.network(normalize_images(images),
                                          training=False)}

  def predict_encoded(self, image_bytes):
    images = tf.map_fn(
        lambda b: imagenet.preprocess_eval(b, self._image_size, tf.float32,
                                           self._crop_fraction),
        image_bytes, fn_output_signature=tf.float32)
    return {'probabilities': self.network(images, training=False)}


def export_saved_model(network: tf_keras.Model, image_size: int,
                       export_dir: str, eval_crop_fraction: float,
                       labels_file: Optional[str] = None) -> str:
  """Writes `network` to `export_dir` with pixel and encoded-file signatures.

  Args:
    network: the classifier on normalised float images.
    image_size: its input height and width.
    export_dir: where the SavedModel goes (replaced if it exists).
    eval_crop_fraction: the central crop `serving_encoded` applies, as the
      run's evaluation did.
    labels_file: class names (the converter's labels.txt) to keep as the
      asset `labels.txt`; None: predictions are class indices.
  """
  module = _Serving(network, image_size, eval_crop_fraction, labels_file)
  signatures = {}
  for name, dtype in (('serving_default', tf.float32),
                      ('serving_uint8', tf.uint8)):
    spec = tf.TensorSpec([None, image_size, image_size, 3], dtype,
                         name='images')
    # A tf.function, not a concrete function: under a distribution strategy
    # only the former can be saved.
    signatures[name] = tf.function(module.predict, input_signature=[spec])
  signatures[ENCODED_SIGNATURE] = tf.function(
      module.predict_encoded,
      input_signature=[tf.TensorSpec([None], tf.string, name='image_bytes')])
  staging = export_dir + '.partial'
  shutil.rmtree(staging, ignore_errors=True)
  tf.saved_model.save(module, staging, signatures=signatures)
  previous = export_dir + '.previous'
  if os.path.exists(export_dir):
    shutil.rmtree(previous, ignore_errors=True)
    os.replace(export_dir, previous)
  os.replace(staging, export_dir)
  shutil.rmtree(previous, ignore_errors=True)
  return export_dir
