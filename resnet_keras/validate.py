"""Evaluates a run's checkpoints on its validation data.

  python -m resnet_keras.validate --model_dir DIR                 # the latest
  python -m resnet_keras.validate --model_dir DIR --checkpoint all
  python -m resnet_keras.validate --model_dir DIR --checkpoint ckpt-4
  python -m resnet_keras.validate --model_dir DIR --data_dir /data/tf_records
  python -m resnet_keras.validate --model_dir DIR --eval_flip   # flip TTA

The model and data flags come from DIR/config.json, which training writes
when it starts, so none are repeated; --data_dir reads other (or moved) data
of the run's --dataset format instead. The evaluation is the trainer's own:
the same input pipeline and the same metrics, every validation example once,
so the run's last checkpoint scores what its last evaluation logged. Prints
a table and writes DIR/validation.csv (one row per checkpoint evaluated).
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import csv
import dataclasses
import io
import os
from typing import Dict, List, Optional

import tensorflow as tf
from absl import flags
from absl import logging

from common import cli
from resnet_keras import assembly
from resnet_keras import checkpoints
from resnet_keras import metrics
from resnet_keras.config import RunConfig, TrainingPlan
# pylint: enable=g-import-not-at-top

RESULTS_FILE = 'validation.csv'
COLUMNS = ('checkpoint', 'step', 'epoch', 'top1', 'top5', 'loss', 'examples')


def define_flags(values: flags.FlagValues) -> None:
  cli.define_model_dir_flag(values)
  flags.DEFINE_string('checkpoint', None,
                      'A checkpoint (a path, or a name in --model_dir such as '
                      'ckpt-4), or "all" for every checkpoint kept; default: '
                      'the latest.',
                      flag_values=values)
  flags.DEFINE_string('data_dir', None,
                      'Read the validation data here instead of the run\'s '
                      'data_dir (same --dataset format; real data even for a '
                      'synthetic-data run).',
                      flag_values=values)
  flags.DEFINE_boolean('eval_flip', None,
                       'Average each image\'s and its mirror\'s logits '
                       '(test-time flip augmentation), or not; default: as '
                       'the run evaluated (its --eval_flip).',
                       flag_values=values)


class CheckpointEvaluator:
  """A run's model, optimizer and validation data, to score its checkpoints.

  The optimizer is the run's own (schedule included), so a checkpoint
  written from these objects (python -m resnet_keras.average) restores in
  training like the run's.
  """

  def __init__(self, cfg: RunConfig, plan: TrainingPlan):
    # The run's dtype as config.json records it (decided); warns, as training
    # does, where this machine only emulates it.
    basis = assembly.set_up(cfg, distributed=False)
    parts = assembly.assemble_evaluation(basis, plan)
    self.cfg, self.plan = basis.cfg, plan
    self.network, self.model = parts.network, parts.model
    self.optimizer, self.manager = parts.optimizer, parts.manager
    # --ema_decay runs: what evaluation scores (swapped in for it).
    self.weight_average = parts.weight_average
    self._evaluator = parts.trainer

  def restore(self, path: str) -> None:
    checkpoints.restore(self.manager.checkpoint, path, self.cfg)

  def evaluate(self, path: str) -> Dict:
    """Restores `path` and scores it: one row of the table."""
    self.restore(path)
    results = self._evaluator.evaluate(tf.constant(-1))
    step = int(self.optimizer.iterations.numpy())
    logging.info('%s: step %d, top-1 %.4f over %d examples', path, step,
                 results['eval_accuracy'], results['eval_examples'])
    return {'checkpoint': os.path.basename(path), 'step': step,
            'epoch': self.plan.epoch_of(step),
            'top1': results['eval_accuracy'],
            'top5': results['eval_top5_accuracy'],
            'loss': results['eval_loss'],
            'examples': results['eval_examples']}


def evaluate_checkpoints(cfg: RunConfig, plan: TrainingPlan,
                         which: Optional[str]) -> List[Dict]:
  """Evaluates each checkpoint `which` names; one row per checkpoint."""
  evaluator = CheckpointEvaluator(cfg, plan)
  return [evaluator.evaluate(path) for path in
          checkpoints.checkpoint_paths(evaluator.manager, cfg.model_dir, which)]


def format_table(rows: List[Dict]) -> str:
  width = max(len('checkpoint'), *(len(r['checkpoint']) for r in rows))
  lines = [f'{"checkpoint":<{width}}  {"step":>8}  {"epoch":>7}  '
           f'{"top-1":>6}  {"top-5":>6}  {"loss":>8}']
  for r in rows:
    lines.append(f'{r["checkpoint"]:<{width}}  {r["step"]:>8}  '
                 f'{r["epoch"]:>7.2f}  {r["top1"]:>6.4f}  {r["top5"]:>6.4f}  '
                 f'{r["loss"]:>8.4f}')
  return '\n'.join(lines)


def write_csv(path: str, rows: List[Dict]) -> None:
  text = io.StringIO()
  writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator='\n')
  writer.writeheader()
  writer.writerows(rows)
  metrics.write_text_atomically(path, text.getvalue())


def main(argv):
  model_dir = cli.start_tool(argv, flags.FLAGS.model_dir)
  cfg, plan = checkpoints.read_config(model_dir)
  if flags.FLAGS.data_dir:
    cfg = dataclasses.replace(cfg, data_dir=flags.FLAGS.data_dir,
                              use_synthetic_data=False)
  if flags.FLAGS.eval_flip is not None:
    cfg = dataclasses.replace(cfg, eval_flip=flags.FLAGS.eval_flip)
  rows = evaluate_checkpoints(cfg, plan, flags.FLAGS.checkpoint)
  print(format_table(rows))
  path = os.path.join(model_dir, RESULTS_FILE)
  write_csv(path, rows)
  print(f'wrote {path}')


if __name__ == '__main__':
  cli.run_entry_point(main, define_flags)
