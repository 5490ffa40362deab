"""SavedModel export with preprocessing inside the serving signatures.

Clients send RGB pixels in 0-255, `[N, image_size, image_size, 3]`, as uint8
(`serving_uint8`) or float32 (`serving_default`), and get class probabilities;
they never need to know the mean the model was trained with. The export is
written to a temporary directory and swapped in, so an existing export is only
replaced by a complete one.
"""

import os
import shutil

import tensorflow as tf
import tf_keras

from resnet_keras.data.preprocessing import normalize_images


class _Serving(tf.Module):

  def __init__(self, network: tf_keras.Model):
    super().__init__()
    self.network = network

  def predict(self, images):
    return {'probabilities': self.network(normalize_images(images),
                                          training=False)}


def export_saved_model(network: tf_keras.Model, image_size: int,
                       export_dir: str) -> str:
  """Writes `network` to `export_dir` with uint8 and float32 signatures."""
  module = _Serving(network)
  signatures = {}
  for name, dtype in (('serving_default', tf.float32),
                      ('serving_uint8', tf.uint8)):
    spec = tf.TensorSpec([None, image_size, image_size, 3], dtype,
                         name='images')
    # A tf.function, not a concrete function: under a distribution strategy
    # only the former can be saved.
    signatures[name] = tf.function(module.predict, input_signature=[spec])
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
