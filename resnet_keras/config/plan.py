"""TrainingPlan: how many steps of what size, from a config, a dataset's size
and the job's layout; it owns every batch size of a run.

`--batch_size` is per worker under Horovod (each worker is a program of its
own, feeding its own replicas) and global for a tf.distribute job (one
program whose strategy spans every replica of every worker): the rule is
common/batch_rule.py's, which make_training_plan applies. The plan also decides when the
host stops a loop to checkpoint or evaluate. Pure arithmetic: no
TensorFlow.
"""

import dataclasses
import math

from common import batch_rule
from common.errors import UsageError
from resnet_keras.config import RunConfig

# The optimizer's and the checkpoints' step counter is an int64.
_MAX_STEP = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
  """How many steps of what size (see the module doc)."""
  global_batch_size: int  # Examples per optimizer step, over the whole job.
  steps_per_epoch: int
  total_train_steps: int
  steps_per_loop: int
  eval_interval_steps: int
  eval_steps: int
  num_eval_examples: int
  checkpoint_interval_steps: int = 0  # 0: epoch ends only.
  first_eval_step: int = 0  # 0: at eval_interval_steps.
  # Programs that each drive their own replicas: Horovod's workers; a
  # tf.distribute job is one program, its strategy spans every worker.
  num_programs: int = 1
  replicas_per_program: int = 1
  num_micro_batches: int = 1  # --num_accumulation_steps
  # --planned_global_batch: the batch the steps and the schedule were
  # planned for, when the job's own differs (an elastic job that lost
  # workers and kept each worker's batch); 0: global_batch_size.
  planned_global_batch_size: int = 0

  @property
  def schedule_batch_size(self) -> int:
    """The global batch the steps and the schedule are counted in."""
    return self.planned_global_batch_size or self.global_batch_size

  @property
  def lr_scale(self) -> float:
    """The linear scaling rule's factor on the planned schedule: the job's
    global batch over the planned one (1 unless --planned_global_batch)."""
    return self.global_batch_size / self.schedule_batch_size

  @property
  def program_batch_size(self) -> int:
    """The batch one program's replicas share (per worker under Horovod)."""
    return self.global_batch_size // self.num_programs

  @property
  def replica_batch_size(self) -> int:
    return self.program_batch_size // self.replicas_per_program

  @property
  def micro_batch_size(self) -> int:
    """What a replica computes at once with gradient accumulation."""
    return self.replica_batch_size // self.num_micro_batches

  @property
  def num_replicas(self) -> int:
    """Replicas over the whole job."""
    return self.num_programs * self.replicas_per_program

  def epoch_of(self, step: int) -> float:
    return step / self.steps_per_epoch

  def is_eval_step(self, step: int) -> bool:
    """The first eval step, every interval after it, and the end."""
    first = self.first_eval_step or self.eval_interval_steps
    return step == self.total_train_steps or (
        step >= first and (step - first) % self.eval_interval_steps == 0)

  def is_checkpoint_step(self, step: int) -> bool:
    """Epoch ends, multiples of the checkpoint interval, and the end."""
    return (step % self.steps_per_epoch == 0 or
            step == self.total_train_steps or
            bool(self.checkpoint_interval_steps and
                 step % self.checkpoint_interval_steps == 0))

  def next_stop(self, step: int) -> int:
    """The next step after `step` where the host checkpoints or evaluates."""
    stops = [(step // self.steps_per_epoch + 1) * self.steps_per_epoch,
             self.total_train_steps]
    if self.checkpoint_interval_steps:
      interval = self.checkpoint_interval_steps
      stops.append((step // interval + 1) * interval)
    return min(stops)


def make_training_plan(cfg: RunConfig, num_train_examples: int,
                       num_eval_examples: int, num_programs: int = 1,
                       replicas_per_program: int = 1) -> TrainingPlan:
  """Turns dataset sizes and the job's layout into batch sizes and steps.

  `--batch_size` is per worker under Horovod (num_programs > 1 processes
  that each see a shard) and global for a tf.distribute job (one program
  drives every replica): common/batch_rule.py. Training drops the
  last partial batch of an epoch; evaluation covers every example. With
  --planned_global_batch the epochs are counted in steps of that batch (the
  planned run's steps), each step taking the job's own batch.
  """
  global_batch = batch_rule.global_batch(cfg.batch_size, num_programs)
  planned = cfg.planned_global_batch or global_batch
  steps_per_epoch = num_train_examples // planned
  if steps_per_epoch == 0:
    raise UsageError(
        f'the global batch ({planned}) is larger than the training set '
        f'({num_train_examples} examples); lower --batch_size')
  if cfg.batch_size % replicas_per_program:
    raise UsageError(
        f'--batch_size={cfg.batch_size} is the global batch and must '
        f'be divisible by the {replicas_per_program} replicas')
  replica_batch = cfg.batch_size // replicas_per_program
  if replica_batch % cfg.num_accumulation_steps:
    raise UsageError(
        f'each replica\'s batch of {replica_batch} cannot be split into '
        f'--num_accumulation_steps={cfg.num_accumulation_steps} equal '
        'micro-batches; use a --batch_size that is a multiple of '
        f'{replicas_per_program * cfg.num_accumulation_steps}')
  if cfg.train_steps:
    steps_per_epoch = min(steps_per_epoch, cfg.train_steps)
  if steps_per_epoch * cfg.train_epochs > _MAX_STEP:
    raise UsageError(
        f'--train_epochs={cfg.train_epochs} of {steps_per_epoch} steps are '
        f'more steps than TensorFlow\'s step counter holds ({_MAX_STEP}); '
        f'use at most --train_epochs={_MAX_STEP // steps_per_epoch}')
  return TrainingPlan(
      global_batch_size=global_batch,
      steps_per_epoch=steps_per_epoch,
      total_train_steps=steps_per_epoch * cfg.train_epochs,
      steps_per_loop=min(cfg.steps_per_loop, steps_per_epoch),
      eval_interval_steps=steps_per_epoch * cfg.epochs_between_evals,
      first_eval_step=steps_per_epoch * cfg.eval_offset_epochs,
      eval_steps=math.ceil(num_eval_examples / global_batch),
      num_eval_examples=num_eval_examples,
      checkpoint_interval_steps=cfg.checkpoint_interval_steps,
      num_programs=num_programs, replicas_per_program=replicas_per_program,
      num_micro_batches=cfg.num_accumulation_steps,
      planned_global_batch_size=cfg.planned_global_batch)
