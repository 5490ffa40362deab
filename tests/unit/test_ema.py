"""--ema_decay: the weight average kept during training (ema.py),
against hand-computed values; what evaluation scores; checkpoints. (A run
that resumes it exactly and exports it: e2e/.)"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from resnet_keras.rundir import checkpoints
from resnet_keras.model import network as network_lib
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.data import synthetic
from tests.support import loops


pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')


def test_decay_at_warms_up_to_the_decay():
  assert float(ema_lib.decay_at(1, 0.999, warmup=False)) == \
      pytest.approx(0.999)
  # (1 + t) / (10 + t) until it reaches the decay.
  assert float(ema_lib.decay_at(1, 0.999, True)) == pytest.approx(2 / 11)
  assert float(ema_lib.decay_at(90, 0.999, True)) == pytest.approx(0.91)
  assert float(ema_lib.decay_at(8, 0.5, True)) == pytest.approx(0.5)
  assert float(ema_lib.decay_at(10**6, 0.999, True)) == \
      pytest.approx(0.999)


@pytest.mark.parametrize('warmup', [False, True])
def test_the_average_of_three_known_updates(warmup):
  weight = tf.Variable([1.0, -2.0])
  average = ema_lib.EMA([weight], 0.5, warmup=warmup)
  np.testing.assert_array_equal(average.averages[0].numpy(), [1.0, -2.0])
  expected = np.array([1.0, -2.0])
  for step, value in enumerate(([2.0, 0.0], [4.0, 4.0], [8.0, 2.0]), 1):
    weight.assign(value)
    average.update(step)
    decay = min(0.5, (1 + step) / (10 + step)) if warmup else 0.5
    expected = decay * expected + (1 - decay) * np.array(value)
    np.testing.assert_allclose(average.averages[0].numpy(), expected,
                               rtol=1e-6)
  if not warmup:  # 1 -> 1.5 -> 2.75 -> 5.375; -2 -> -1 -> 1.5 -> 1.75
    np.testing.assert_allclose(average.averages[0].numpy(), [5.375, 1.75])


def test_swapping_gives_the_weights_back_bit_for_bit_even_on_errors():
  weight = tf.Variable(np.random.RandomState(0).normal(size=[5]),
                       dtype=tf.float32)
  original = weight.numpy()
  average = ema_lib.EMA([weight], 0.9)
  weight.assign(original * 3.7 + 0.1)
  average.update(1)
  trained, averaged = weight.numpy(), average.averages[0].numpy()
  with pytest.raises(RuntimeError):
    with ema_lib.in_model(average):
      np.testing.assert_array_equal(weight.numpy(), averaged)
      raise RuntimeError('evaluation failed')
  np.testing.assert_array_equal(weight.numpy(), trained)
  np.testing.assert_array_equal(average.averages[0].numpy(), averaged)
  with ema_lib.in_model(None):  # no average: the model as it is
    np.testing.assert_array_equal(weight.numpy(), trained)


def _trainer(model, average, batch=4):
  return loops.trainer(
      model, tf_keras.optimizers.legacy.SGD(0.02),
      synthetic.train_dataset(batch, 32, 5, tf.float32), batch_size=batch,
      steps_per_loop=1, ema=average)


def _evaluator(model, average, batch=4):
  return loops.evaluator(
      model, synthetic.eval_dataset(batch, 32, 5, tf.float32, 10),
      ema=average)


def test_the_trainer_averages_every_variable_and_evaluates_the_average(
    tmp_path):
  """After each step every model variable (batch-norm statistics included)
  moves its average; evaluation scores the average and leaves the trained
  weights as they were; a checkpoint holds both."""
  net = network_lib.resnet(10, 5, 32, filters=(16, 32, 64, 128))
  average = ema_lib.EMA(net.variables, 0.6, warmup=True)
  trainer = _trainer(net, average)
  expected = [v.numpy() for v in net.variables]
  for step in (1, 2, 3):
    trainer.train(tf.constant(1))
    decay = min(0.6, (1 + step) / (10 + step))
    expected = [decay * e + (1 - decay) * v.numpy()
                for e, v in zip(expected, net.variables)]
  moving = [i for i, v in enumerate(net.variables) if 'moving_' in v.name]
  assert moving  # the batch-norm statistics are averaged too
  for e, a in zip(expected, average.averages):
    np.testing.assert_allclose(a.numpy(), e, rtol=1e-5, atol=1e-6)

  trained = [v.numpy() for v in net.variables]
  scored = _evaluator(net, average).evaluate(tf.constant(-1))
  for t, v in zip(trained, net.variables):
    np.testing.assert_array_equal(v.numpy(), t)
  # The same evaluation of a copy that holds the averages as its weights.
  copy = network_lib.resnet(10, 5, 32, filters=(16, 32, 64, 128))
  copy.set_weights([a.numpy() for a in average.averages])
  plain = _evaluator(copy, None).evaluate(tf.constant(-1))
  assert scored == pytest.approx(plain, rel=1e-5)
  unaveraged = _evaluator(net, None).evaluate(tf.constant(-1))
  assert scored['eval_loss'] != pytest.approx(unaveraged['eval_loss'])

  path = checkpoints.checkpoint_of(net, trainer.optimizer, average).save(
      str(tmp_path / 'ckpt'))
  assert checkpoints.has_ema(path)
  assert not checkpoints.has_ema(
      checkpoints.checkpoint_of(net).save(str(tmp_path / 'plain')))
  fresh = network_lib.resnet(10, 5, 32, filters=(16, 32, 64, 128))
  restored = ema_lib.EMA(fresh.variables, 0.6)
  checkpoints.checkpoint_of(fresh, ema=restored).restore(
      path).expect_partial()
  for a, r in zip(average.averages, restored.averages):
    np.testing.assert_array_equal(r.numpy(), a.numpy())
