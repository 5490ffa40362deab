"""An exponential moving average of the weights, kept during training.

  --ema_decay D [--ema_warmup]

After every optimizer step each of the model's variables pulls its average
towards it: avg <- d * avg + (1 - d) * w, with d = D, or with --ema_warmup
d = min(D, (1 + t) / (10 + t)) at step t (tf.train.ExponentialMovingAverage's
num_updates form), so the early average forgets the random start quickly.
Every variable is averaged, batch-norm moving statistics included (as
`python -m resnet_keras.average --ema` averages checkpoints): the averaged
network's norms normalise with statistics of averaged weights.

The averages start as the model's weights (initial, restored or warm
started; start.py decides which), live in the checkpoint beside the model
(under `weight_average`, the name checkpoints have always held them under),
so a run resumes them exactly, and are what the run evaluates, what validate
scores and what is exported; the model's own weights keep training.

One set of averages on every backend: each average is a variable of its
weight's kind (mirrored for trainable weights, per-replica sync-on-read for
batch-norm statistics, read as their mean like the statistics themselves)
and is updated on each device from that device's copy. Horovod's workers
hold the same trained weights after each step, so those averages agree;
batch-norm statistics (and their averages) are each worker's own until the
loop's end, when every worker takes the chief's (trainer.py).

tf-models-official's ExponentialMovingAverage optimizer does the same job
differently: its averages are optimizer slots that start at zero (biased
towards zero unless its dynamic decay is on), it wraps the optimizer (our
fp16 loss-scale wrapper must stay outermost), and it swaps the weights in
and out by adding and subtracting, which does not give them back bit for
bit: an evaluation in the middle of a run would change how it resumes.
"""

import contextlib
from typing import Optional, Sequence

import tensorflow as tf


def decay_at(step, decay: float, warmup: bool) -> tf.Tensor:
  """The decay of the average's update after optimizer step `step` (the
  first is 1); `step` may be a tensor."""
  decay = tf.constant(decay, tf.float32)
  if not warmup:
    return decay
  step = tf.cast(step, tf.float32)
  return tf.minimum(decay, (1.0 + step) / (10.0 + step))


class EMA:
  """Averages of `variables` (the model's), updated after each step.

  Build it under the strategy's scope, after the model; `trackable` is what
  the checkpoint saves (the averages only: the weights are the model's).
  """

  def __init__(self, variables: Sequence[tf.Variable], decay: float,
               warmup: bool = False):
    self.decay = decay
    self.warmup = warmup
    self._strategy = tf.distribute.get_strategy()
    self._weights = list(variables)
    self.averages = [
        tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False,
                    name=w.name.split(':')[0] + '_average',
                    synchronization=w.synchronization,
                    aggregation=w.aggregation)
        for w in self._weights]
    self.trackable = tf.train.Checkpoint(averages=self.averages)
    # Traced once each: a call per variable from Python would be slow.
    self._reset = tf.function(lambda: self._on_each_device(
        lambda average, weight: average.assign(weight)), autograph=False)
    self._swap = tf.function(lambda: self._on_each_device(_exchange),
                             autograph=False)
    self.reset()

  def averages_of(self, variables: Sequence[tf.Variable]) -> list:
    """The averages of those of the model's `variables`."""
    wanted = {id(v) for v in variables}
    return [a for a, w in zip(self.averages, self._weights)
            if id(w) in wanted]

  def reset(self) -> None:
    """Averages := the weights (a new start, or a warm start)."""
    self._reset()

  def update(self, step) -> None:
    """One update after optimizer step `step`, inside the training step's
    tf.function (cross-replica context)."""
    decay = decay_at(step, self.decay, self.warmup)

    def pull(average, weight):
      d = tf.cast(decay, average.dtype)
      return average.assign(d * average + (1 - d) * weight)

    self._on_each_device(pull)

  def swap(self) -> None:
    """Exchanges the weights and their averages, bit for bit."""
    self._swap()

  @contextlib.contextmanager
  def swapped(self):
    """The averages in the model inside the block, the weights after it,
    whatever happens inside."""
    self.swap()
    try:
      yield
    finally:
      self.swap()

  def _on_each_device(self, fn) -> None:
    """fn(average, weight) on every device's copy of each pair."""
    with self._strategy.scope():
      for average, weight in zip(self.averages, self._weights):
        self._strategy.extended.update(average, fn, args=(weight,),
                                       group=False)


def in_model(average: Optional[EMA]):
  """A block in which the model holds `average`'s averages; with None (no
  --ema_decay), its own weights."""
  return average.swapped() if average else contextlib.nullcontext()


def _exchange(average, weight):
  held = tf.identity(average)
  with tf.control_dependencies([held]):
    assigned = average.assign(weight)
  with tf.control_dependencies([assigned]):
    return weight.assign(held)
