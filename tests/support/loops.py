"""A Trainer and an Evaluator around a bare model, in this process, as
assembly.py composes them for a run (one replica, no guards but the stop
poll a test asks for)."""

from typing import Callable, Optional

import tensorflow as tf

from resnet_keras.engine import distribution
from resnet_keras.engine import guards
from resnet_keras.engine.evaluator import Evaluator
from resnet_keras.engine.objective import Objective
from resnet_keras.engine.step_record import StepRecord
from resnet_keras.engine.trainer import Trainer


def trainer(model, optimizer, train_dataset, batch_size: int,
            steps_per_loop: int, num_classes: int = 5,
            stop_requested: Optional[Callable[[], bool]] = None,
            ema=None, use_tf_while_loop: bool = True,
            progress: Optional[distribution.Progress] = None,
            **objective_options) -> Trainer:
  """Trains `model` on `train_dataset` (batches of `batch_size`); each
  loop's output holds its LoopRecord (metrics.LOOP_RECORD). `progress`: the
  backend's, which the stop poll beats before each step."""
  backend = distribution.Backend(tf.distribute.get_strategy(),
                                 progress=progress or distribution.Progress())
  objective = Objective(model=model, optimizer=optimizer, backend=backend,
                        num_classes=num_classes,
                        program_batch_size=batch_size, **objective_options)
  record = StepRecord(optimizer.iterations, steps_per_loop,
                      with_loss_scales=objective.uses_loss_scale)
  return Trainer(
      objective=objective, step_record=record, train_dataset=train_dataset,
      global_batch_size=batch_size, backend=backend,
      weights_finite=guards.finite_check(model.variables),
      ema=ema,
      stop_poll=(stop_requested and
                 guards.stop_poll(stop_requested, backend)),
      use_tf_while_loop=use_tf_while_loop)


def evaluator(model, eval_dataset, num_classes: int = 5,
              eval_flip: bool = False, ema=None) -> Evaluator:
  return Evaluator(
      model=model, eval_dataset=eval_dataset, num_classes=num_classes,
      backend=distribution.Backend(tf.distribute.get_strategy()),
      eval_flip=eval_flip, ema=ema)
