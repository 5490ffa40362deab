"""Process environment that must be set before TensorFlow is imported."""

import os


def prepare_tensorflow_environment() -> None:
  """tf_keras as Keras, and TensorFlow's C++ logs down to what matters.

  tf_keras (Keras 2) is the Keras this project trains with; tf-models-official
  and Horovod are built on it. TensorFlow's CUDA build logs a cuInit *error*
  on every start on a machine without an NVIDIA driver; there it is noise, so
  C++ logs are silenced (errors still surface as Python exceptions). Values
  the user already set win.
  """
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  has_nvidia_driver = os.path.exists('/proc/driver/nvidia/version')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL',
                        '2' if has_nvidia_driver else '3')
