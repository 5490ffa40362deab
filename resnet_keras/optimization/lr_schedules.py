"""The learning rate's schedules: linear warmup, then one of tf_keras's
decays.

All schedules ramp linearly from 0 at step 0 to the peak at `warmup_steps`
(lr = peak * step / warmup_steps), then follow the decay. Decays that describe
"the rest of the run" (polynomial, cosine, exponential) are evaluated at
`step - warmup_steps`, so the peak is exactly `--base_learning_rate` (scaled
for SGD and RMSProp) when warmup ends; piecewise boundaries are absolute
epochs, as in the reference recipes, and stepped ones absolute fractions of
the run. With --lr_per_epoch any of them is held through each epoch at its
value in the epoch's middle, a new value an epoch (FFCV's recipes step
theirs by epoch).
"""

from typing import Sequence

import tensorflow as tf
import tf_keras

from resnet_keras.config import RunConfig

# The classic ImageNet SGD recipe: x0.1 at epochs 30, 60 and 80.
PIECEWISE_BOUNDARY_EPOCHS = (30, 60, 80)
PIECEWISE_MULTIPLIERS = (1.0, 0.1, 0.01, 0.001)
POLYNOMIAL_POWER = 2.0
# SGD learning rates are quoted per 256 images (Goyal et al., 2017).
SGD_REFERENCE_BATCH = 256


def peak_learning_rate(cfg: RunConfig, global_batch_size: int) -> float:
  """--base_learning_rate at its peak: per 256 images, scaled linearly with
  the global batch, except LARS's, which is absolute."""
  if cfg.uses_lars:
    return cfg.base_learning_rate
  return cfg.base_learning_rate * global_batch_size / SGD_REFERENCE_BATCH


class WarmupThenDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
  """Linear warmup to `peak`, then `decay(step - decay_offset)`."""

  def __init__(self, peak: float, warmup_steps: int, decay, decay_offset: int):
    super().__init__()
    self.peak = float(peak)
    self.warmup_steps = int(warmup_steps)
    self.decay = decay
    self.decay_offset = int(decay_offset)

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    decayed = tf.cast(self.decay(tf.maximum(step - self.decay_offset, 0.0)),
                      tf.float32)
    if self.warmup_steps == 0:
      return decayed
    warmup = self.peak * step / self.warmup_steps
    return tf.where(step < self.warmup_steps, warmup, decayed)

  def get_config(self):
    return {'peak': self.peak, 'warmup_steps': self.warmup_steps,
            'decay': tf_keras.optimizers.schedules.serialize(self.decay),
            'decay_offset': self.decay_offset}


class PerEpoch(tf_keras.optimizers.schedules.LearningRateSchedule):
  """`schedule` held through each epoch at its value in the epoch's middle
  (--lr_per_epoch): no epoch at warmup's 0 or at a decay's end of 0."""

  def __init__(self, schedule, steps_per_epoch: int):
    super().__init__()
    self.schedule = schedule
    self.steps_per_epoch = int(steps_per_epoch)

  def __call__(self, step):
    epoch = tf.math.floordiv(tf.cast(step, tf.int64), self.steps_per_epoch)
    return self.schedule((tf.cast(epoch, tf.float32) + 0.5) *
                         self.steps_per_epoch)

  def get_config(self):
    return {'schedule': tf_keras.optimizers.schedules.serialize(self.schedule),
            'steps_per_epoch': self.steps_per_epoch}


class Scaled(tf_keras.optimizers.schedules.LearningRateSchedule):
  """`schedule` times `factor` at every step: the linear scaling rule
  applied to a whole planned schedule (--planned_global_batch)."""

  def __init__(self, schedule, factor: float):
    super().__init__()
    self.schedule = schedule
    self.factor = float(factor)

  def __call__(self, step):
    return self.factor * tf.cast(self.schedule(step), tf.float32)

  def get_config(self):
    return {'schedule': tf_keras.optimizers.schedules.serialize(self.schedule),
            'factor': self.factor}


class _Constant(tf_keras.optimizers.schedules.LearningRateSchedule):
  """tf_keras has no constant schedule; this keeps every decay the same type."""

  def __init__(self, value: float):
    super().__init__()
    self.value = float(value)

  def __call__(self, step):
    del step
    return tf.constant(self.value, tf.float32)

  def get_config(self):
    return {'value': self.value}


def build_schedule(name: str, peak: float, warmup_steps: int, total_steps: int,
                   steps_per_epoch: int,
                   end_learning_rate: float = RunConfig.end_learning_rate,
                   decay_steps: int = 0,
                   boundary_epochs: Sequence[float] = PIECEWISE_BOUNDARY_EPOCHS,
                   multipliers: Sequence[float] = PIECEWISE_MULTIPLIERS,
                   decay_factor: float = RunConfig.lr_decay_factor,
                   decay_points: Sequence[float] = RunConfig.lr_decay_points,
                   decay_epochs: float = RunConfig.lr_decay_epochs):
  """Returns the schedule `name` with linear warmup.

  Args:
    name: piecewise | polynomial | constant | cosine | stepped | exponential
      | linear.
    peak: the learning rate when warmup ends.
    warmup_steps: steps of linear warmup from 0.
    total_steps: steps in the whole run (where cosine, linear and the
      default polynomial end).
    steps_per_epoch: converts piecewise boundary epochs to steps.
    end_learning_rate: where polynomial and cosine decays end.
    decay_steps: polynomial: the step at which the decay reaches
      end_learning_rate (0: total_steps); it stays there afterwards.
    boundary_epochs: piecewise: epochs where the next multiplier starts.
    multipliers: piecewise: factors of `peak`, one more than boundaries.
    decay_factor: stepped and exponential: the factor of each decay step.
    decay_points: stepped: fractions of total_steps where a step happens.
    decay_epochs: exponential: epochs per step (staircase, after warmup).
  """
  schedules = tf_keras.optimizers.schedules
  if name in ('piecewise', 'stepped'):
    if name == 'stepped':
      boundaries = stepped_boundaries(decay_points, total_steps)
      multipliers = [decay_factor ** i for i in range(len(boundaries) + 1)]
    else:
      boundaries = [int(e * steps_per_epoch) for e in boundary_epochs]
    decay = schedules.PiecewiseConstantDecay(
        boundaries=boundaries, values=[peak * m for m in multipliers])
    return WarmupThenDecay(peak, warmup_steps, decay, decay_offset=0)
  if name == 'exponential':
    decay = schedules.ExponentialDecay(
        initial_learning_rate=peak,
        decay_steps=max(int(round(decay_epochs * steps_per_epoch)), 1),
        decay_rate=decay_factor, staircase=True)
    return WarmupThenDecay(peak, warmup_steps, decay, warmup_steps)
  if name == 'polynomial':
    decay_end = decay_steps or total_steps
    decay = schedules.PolynomialDecay(
        initial_learning_rate=peak,
        decay_steps=max(decay_end - warmup_steps, 1),
        end_learning_rate=end_learning_rate, power=POLYNOMIAL_POWER)
    return WarmupThenDecay(peak, warmup_steps, decay, warmup_steps)
  if name == 'linear':
    # FFCV's ResNet recipes: linear warmup, then linear decay to exactly 0
    # at the last step (no end_learning_rate floor).
    decay = schedules.PolynomialDecay(
        initial_learning_rate=peak,
        decay_steps=max(total_steps - warmup_steps, 1),
        end_learning_rate=0.0, power=1.0)
    return WarmupThenDecay(peak, warmup_steps, decay, warmup_steps)
  if name == 'cosine':
    decay = schedules.CosineDecay(
        initial_learning_rate=peak,
        decay_steps=max(total_steps - warmup_steps, 1),
        alpha=end_learning_rate / peak)
    return WarmupThenDecay(peak, warmup_steps, decay, warmup_steps)
  if name == 'constant':
    return WarmupThenDecay(peak, warmup_steps, _Constant(peak), warmup_steps)
  raise ValueError(f'unknown schedule {name}')


def stepped_boundaries(points: Sequence[float], total_steps: int):
  """The steps after which each decay of a stepped schedule applies."""
  return [int(round(p * total_steps)) for p in points]


def schedule_for_run(cfg: RunConfig, global_batch_size: int,
                     steps_per_epoch: int, total_steps: int,
                     scale: float = 1.0):
  """The schedule the flags ask for, in steps of the global batch the run
  was planned for, times `scale` (the job's batch over the planned one)."""
  schedule = build_schedule(
      name=cfg.lr_schedule,
      peak=peak_learning_rate(cfg, global_batch_size),
      warmup_steps=int(round(cfg.warmup_epochs * steps_per_epoch)),
      total_steps=total_steps,
      steps_per_epoch=steps_per_epoch,
      end_learning_rate=cfg.end_learning_rate,
      decay_steps=int(round(cfg.lars_decay_epochs * steps_per_epoch)),
      decay_factor=cfg.lr_decay_factor,
      decay_points=cfg.lr_decay_points,
      decay_epochs=cfg.lr_decay_epochs)
  if cfg.lr_per_epoch:
    schedule = PerEpoch(schedule, steps_per_epoch)
  return Scaled(schedule, scale) if scale != 1 else schedule
