"""Checkpoints in model_dir: what is saved, how often, how a rerun resumes.

The model and the optimizer (slots, iteration count, loss scale) are saved
together, so a rerun with the same model_dir continues at the saved step with
the same optimizer state and learning-rate position.
"""

import tensorflow as tf

MAX_TO_KEEP = 5


def make_manager(model, optimizer, model_dir: str,
                 max_to_keep: int = MAX_TO_KEEP) -> tf.train.CheckpointManager:
  """A manager for model_dir. run.py decides when to save (every epoch)."""
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  return tf.train.CheckpointManager(
      checkpoint, directory=model_dir, max_to_keep=max_to_keep,
      step_counter=optimizer.iterations)
