"""ONNX and TFLite exports (resnet_keras/serving/deployment.py): every
architecture the trainer builds converts to the same function. (A trained
run's exports in every format, validate and predict on them: e2e/.)"""

import dataclasses

import numpy as np
import pytest
import tf_keras

from resnet_keras.model import network as network_lib
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.serving import converters
from resnet_keras.serving import deployment
from resnet_keras.serving import readers
from resnet_keras.serving import saved_model
from tests.support import runner


@pytest.mark.parametrize('overrides', [
    dict(resnet_depth=10, stem='imagenet', norm='group', groups=4,
         blurpool=True),
    dict(resnet_depth=50, stem='small', width_multiplier=0.125,
         zero_init_residual=True),
], ids=['group_norm_blurpool', 'bottleneck'])
def test_architectures_convert_to_the_same_function(overrides, tmp_path,
                                                    policy):
  """Every layer kind the trainer builds converts: a bf16 run's network
  becomes float32 files whose probabilities are its float32 copy's."""
  cfg = dataclasses.replace(runner.tiny_config(str(tmp_path)), image_size=32,
                            dtype='bf16', **overrides)
  policy('mixed_bfloat16')
  tf_keras.utils.set_random_seed(3)
  network = network_lib.build_network(cfg, 7, use_regularizers=False)
  policy('float32')
  pixels = np.random.RandomState(0).randint(0, 256, (4, 32, 32, 3), np.uint8)
  plan = deployment.DeployPlan(files=(('onnx', 'none'), ('tflite', 'none')),
                               check_images=pixels, representative=None,
                               labels=[])
  paths = deployment.write_deployables(network, cfg, str(tmp_path), plan,
                                       'ckpt-1', 1)
  with converters.float32_layers():
    copy = saved_model.portable_copy(network, cfg)
  expected = copy(normalize_images(pixels), training=False).numpy()
  for path in paths:
    np.testing.assert_allclose(readers.load(path)(pixels), expected,
                               atol=1e-5)
