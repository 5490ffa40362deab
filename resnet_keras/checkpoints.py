"""Checkpoints in model_dir: what is saved, how often, how a rerun resumes.

The model and the optimizer (slots, iteration count, loss scale) are saved
together, so a rerun with the same model_dir continues at the saved step with
the same optimizer state and learning-rate position.
"""

import json
import os
from typing import Dict

import tensorflow as tf

from resnet_keras.errors import UsageError
from resnet_keras.metrics import write_json_atomically

MAX_TO_KEEP = 5
# What the checkpoints in a model_dir are checkpoints of.
MODEL_FILE = 'model.json'


def make_manager(model, optimizer, model_dir: str,
                 max_to_keep: int = MAX_TO_KEEP) -> tf.train.CheckpointManager:
  """A manager for model_dir. run.py decides when to save (every epoch)."""
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  return tf.train.CheckpointManager(
      checkpoint, directory=model_dir, max_to_keep=max_to_keep,
      step_counter=optimizer.iterations)


def latest_step(model_dir: str) -> int:
  """Step of model_dir's latest checkpoint (0: none); run.py names
  checkpoints by step (`ckpt-<step>`)."""
  latest = tf.train.latest_checkpoint(model_dir) if os.path.isdir(
      model_dir) else None
  return int(latest.rsplit('-', 1)[1]) if latest else 0


def model_identity(model_name: str, stem: str, num_classes: int) -> Dict:
  """The properties a checkpoint must share with a model to restore into it."""
  return {'model': model_name, 'stem': stem, 'num_classes': num_classes}


def check_resumable(model_dir: str, identity: Dict) -> None:
  """Refuses a model_dir whose checkpoints belong to a different model.

  Restoring them would fail on a shape mismatch halfway, or worse, succeed
  partially; and a later save would mix the two runs.
  """
  path = os.path.join(model_dir, MODEL_FILE)
  if not (tf.train.latest_checkpoint(model_dir) and os.path.exists(path)):
    return
  with open(path) as f:
    saved = json.load(f)
  if saved != identity:
    describe = lambda d: ', '.join(f'{k} {v}' for k, v in sorted(d.items()))
    raise UsageError(
        f'--model_dir={model_dir} holds checkpoints of another model '
        f'({describe(saved)}; this run: {describe(identity)}); use another '
        '--model_dir, or --clean to delete them and start over')


def record_model(model_dir: str, identity: Dict) -> None:
  write_json_atomically(os.path.join(model_dir, MODEL_FILE), identity)
