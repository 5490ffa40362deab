"""Exports of a network (resnet_keras/serving/saved_model.py): serving
signatures plus the Reusable SavedModel API, a feature vector, fine-tuning
in another program, the portable copy. (python -m resnet_keras.export on a
trained run: e2e/.)"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.model import layers
from resnet_keras.model import network as network_lib
from resnet_keras.optimization import optimizers
from resnet_keras.config import RunConfig
from resnet_keras.data.preprocessing import normalize_images
from resnet_keras.serving import contract
from resnet_keras.serving import saved_model
from tests.support.images import uniform_pixels

# The module's export is built once, in one worker.
# Slow (not in ./scripts/test.sh --quick): its tests export (the module's
# network, a ResNet-50, a portable copy) or read the module's export, 8-43 s
# each in the suite under load.
pytestmark = [pytest.mark.xdist_group('export'), pytest.mark.slow]

IMAGE_SIZE = 32
# Small enough to build, save and load in seconds; every kind of layer.
TINY = RunConfig(resnet_depth=18, image_size=IMAGE_SIZE, stem='cifar',
                 width_multiplier=0.25, dtype='fp32', weight_decay=1e-4)


def _network(cfg=TINY, num_classes=5):
  tf_keras.utils.set_random_seed(1)
  return network_lib.build_network(cfg, num_classes, use_regularizers=False)


def _count(variables):
  return int(sum(np.prod(v.shape) for v in variables))


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """(network, classifier dir, feature vector dir) of a tiny model."""
  network = _network()
  out = str(tmp_path_factory.mktemp('export'))
  classifier, features = saved_model.export_run(network, TINY, out,
                                           feature_vector=True)
  return network, classifier, features


def test_classifier_call_equals_its_serving_signatures(exported):
  network, classifier, _ = exported
  loaded = tf.saved_model.load(classifier)
  pixels = uniform_pixels()
  called = loaded(tf.constant(pixels), training=False).numpy()
  np.testing.assert_allclose(called, network(normalize_images(pixels)),
                             rtol=1e-5, atol=1e-6)
  served = loaded.signatures['serving_default'](images=tf.constant(pixels))
  np.testing.assert_allclose(called, served['probabilities'], rtol=1e-6)
  as_uint8 = np.round(pixels).astype(np.uint8)
  np.testing.assert_allclose(
      loaded(tf.constant(as_uint8, tf.float32), training=False),
      loaded.signatures['serving_uint8'](images=as_uint8)['probabilities'],
      rtol=1e-6)
  np.testing.assert_allclose(called.sum(axis=1), 1, rtol=1e-5)


def test_reusable_attributes_are_the_whole_network(exported):
  network, classifier, features = exported
  loaded = tf.saved_model.load(classifier)
  assert len(loaded.variables) == len(network.variables)
  assert (_count(loaded.trainable_variables) ==
          _count(network.trainable_variables))
  # One L2 term of the run's weight decay, as training applied it.
  losses = loaded.regularization_losses
  assert len(losses) == 1
  expected = optimizers.single_l2_loss(network.trainable_variables, 1e-4)
  assert float(losses[0]()) == pytest.approx(float(expected), rel=1e-6)
  head = network.get_layer(network_lib.HEAD_LAYER)
  backbone = tf.saved_model.load(features)
  assert (_count(backbone.trainable_variables) ==
          _count(network.trainable_variables) - head.count_params())


def test_feature_vector_is_what_the_head_reads(exported):
  network, _, features = exported
  loaded = tf.saved_model.load(features)
  pixels = uniform_pixels()
  got = loaded(tf.constant(pixels), training=False).numpy()
  head = network.get_layer(network_lib.HEAD_LAYER)
  assert got.shape == (3, head.kernel.shape[0])
  logits = got @ head.kernel.numpy() + head.bias.numpy()
  np.testing.assert_allclose(tf.nn.softmax(logits),
                             network(normalize_images(pixels)),
                             rtol=1e-4, atol=1e-6)
  served = loaded.signatures['serving_default'](images=tf.constant(pixels))
  np.testing.assert_allclose(got, served['features'], rtol=1e-6)


@pytest.mark.parametrize('trainable', [True, False])
def test_feature_vector_fine_tunes_in_a_new_keras_model(exported, trainable):
  import tensorflow_hub as hub  # pylint: disable=g-import-not-at-top
  _, _, features = exported
  tf_keras.utils.set_random_seed(2)
  backbone = hub.KerasLayer(features, trainable=trainable)
  inputs = tf_keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
  head = tf_keras.layers.Dense(3, name='new_head')
  model = tf_keras.Model(inputs, head(backbone(inputs)))
  # The export's weight decay joins the loss only where it is trained.
  assert (sum(float(l) for l in model.losses) > 0) == trainable
  before = [v.numpy() for v in backbone.variables]
  head_before = head.kernel.numpy()
  model.compile(optimizer=tf_keras.optimizers.SGD(0.1),
                loss=tf_keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  model.fit(uniform_pixels(8, seed=3), np.arange(8) % 3, batch_size=8,
            epochs=1, verbose=0)
  assert not np.allclose(head.kernel.numpy(), head_before)
  moved = [not np.array_equal(b, v.numpy())
           for b, v in zip(before, backbone.variables)]
  if trainable:
    # Kernels move with their gradient, batch-norm statistics with the batch.
    assert sum(moved) > len(moved) // 2
  else:
    assert not any(moved)


def test_resnet50_export_has_the_published_parameter_count(tmp_path):
  cfg = dataclasses.replace(TINY, resnet_depth=50, stem='imagenet',
                            width_multiplier=1.0)
  network = network_lib.build_network(cfg, 1000, use_regularizers=False)
  path = saved_model.export_saved_model(network, str(tmp_path / 'r50'),
                                   contract.CLASSIFIER_OUTPUT, IMAGE_SIZE, 0.875)
  loaded = tf.saved_model.load(path)
  assert _count(loaded.trainable_variables) == 25_557_032
  assert loaded.regularization_losses == []  # No weight decay given.


def _kernels(network):
  """(conv classes, batch norms synchronised?, ReLU impls, all trainable?)"""
  kinds = lambda f, cls: {f(l) for l in network.layers if isinstance(l, cls)}
  return (kinds(lambda l: type(l).__name__, tf_keras.layers.Conv2D),
          kinds(lambda l: l.synchronized,
                tf_keras.layers.BatchNormalization),
          kinds(lambda l: l.impl, (layers.ResidualAdd, layers.ResidualRelu)),
          all(l.trainable for l in network.layers))


def test_portable_copy_is_standard_layers_with_the_same_outputs():
  """Kernels, distribution and freezing of training stay out of exports;
  the architecture (here BlurPool's blurred downsampling) stays in."""
  cfg = dataclasses.replace(TINY, conv_impl='matmul', relu_impl='xla',
                            sync_batch_norm=True, freeze_backbone=True,
                            blurpool=True)
  network = _network(cfg)
  copy = saved_model.portable_copy(network, cfg)
  assert _kernels(network) == ({'MatmulConv2D'}, {True}, {'xla'}, False)
  assert _kernels(copy) == ({'Conv2D'}, {False}, {'native'}, True)
  blurs = lambda net: [l.name for l in net.layers
                       if isinstance(l, layers.Blur)]
  assert blurs(copy) == blurs(network) and blurs(copy)
  pixels = normalize_images(uniform_pixels())
  np.testing.assert_allclose(copy(pixels), network(pixels), rtol=1e-4,
                             atol=1e-6)
