"""Evaluates a run's checkpoints on its validation data.

  python -m resnet_keras.validate --model_dir DIR                 # the latest
  python -m resnet_keras.validate --model_dir DIR --checkpoint all
  python -m resnet_keras.validate --model_dir DIR --checkpoint ckpt-4
  python -m resnet_keras.validate --model_dir DIR --data_dir /data/tf_records
  python -m resnet_keras.validate --model_dir DIR --eval_flip   # flip TTA
  python -m resnet_keras.validate --model_dir DIR \
      --saved_model DIR/saved_model,DIR/exports/ckpt-8/model_int8.tflite

The model and data flags come from DIR/config.json, which training writes
when it starts, so none are repeated; --data_dir reads other (or moved) data
of the run's --dataset format instead. The evaluation is the trainer's own:
the same input pipeline and the same metrics, every validation example once,
so the run's last checkpoint scores what its last evaluation logged. Prints
a table and writes DIR/validation.csv (one row per checkpoint evaluated).

--saved_model scores exports instead (SavedModel directories, ONNX or TFLite
files: deploy.py), each on the same uint8 pixels of the same validation
images, with the largest difference of its probabilities from the first
export's: DIR/validation_exports.csv.
"""

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

# pylint: disable=g-import-not-at-top
import csv
import dataclasses
import io
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras
from absl import flags
from absl import logging

from common import cli
from common.errors import UsageError
from resnet_keras import assembly
from resnet_keras import checkpoints
from resnet_keras import deploy
from resnet_keras import metrics
from resnet_keras import trainer
from resnet_keras.config import RunConfig, TrainingPlan
from resnet_keras.data import datasets
# pylint: enable=g-import-not-at-top

RESULTS_FILE = 'validation.csv'
COLUMNS = ('checkpoint', 'step', 'epoch', 'top1', 'top5', 'loss', 'examples')
EXPORTS_RESULTS_FILE = 'validation_exports.csv'
EXPORTS_COLUMNS = ('export', 'kind', 'step', 'top1', 'top5', 'loss',
                   'examples', 'max_prob_diff')


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
  flags.DEFINE_list('saved_model', None,
                    'Score these exports instead of checkpoints: SavedModel '
                    'directories, .onnx or .tflite files (comma-separated); '
                    'each compared with the first.',
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


def score_exports(cfg: RunConfig, paths: Sequence[str],
                  batch_size: int = 64) -> List[Dict]:
  """Scores each export at `paths` on the run's validation data as its
  evaluation does (every image once; --eval_flip: with its mirror), and
  the largest difference of its probabilities from the first export's."""
  exports = [deploy.load(path) for path in paths]
  info = datasets.describe(cfg)
  for path, export in zip(paths, exports):
    if (export.image_size, export.num_classes) != (cfg.eval_size,
                                                   info.num_classes):
      raise UsageError(
          f'{path} takes {export.image_size} px images to '
          f'{export.num_classes} classes, the run evaluates {cfg.eval_size} '
          f'px images of {info.num_classes}: export this run\'s checkpoint')
  sums = [dict(top1=0, top5=0, loss=0.0, examples=0, max_prob_diff=0.0)
          for _ in exports]
  for images, labels in datasets.pixel_batches(cfg, info, batch_size):
    images, labels = images.numpy(), labels.numpy()
    first = None
    for export, total in zip(exports, sums):
      probs = export(images)
      if cfg.eval_flip:
        probs = trainer.flip_average(
            probs, export(np.ascontiguousarray(images[:, :, ::-1]))).numpy()
      first = probs if first is None else first
      top5 = np.argsort(-probs, axis=-1, kind='stable')[:, :5]
      total['top1'] += int(np.sum(top5[:, 0] == labels))
      total['top5'] += int(np.sum(top5 == labels[:, None]))
      total['loss'] += float(np.sum(
          tf_keras.losses.sparse_categorical_crossentropy(labels, probs)))
      total['examples'] += len(labels)
      total['max_prob_diff'] = max(total['max_prob_diff'],
                                   float(np.max(np.abs(probs - first))))
  rows = []
  for path, export, total in zip(paths, exports, sums):
    n = max(total['examples'], 1)
    rows.append({'export': path, 'kind': export.kind, 'step': export.step,
                 'top1': total['top1'] / n, 'top5': total['top5'] / n,
                 'loss': total['loss'] / n, 'examples': total['examples'],
                 'max_prob_diff': total['max_prob_diff']})
  return rows


# A table's columns: (header, row key, alignment and width, value format).
# The first column is as wide as its widest entry.
_SCORE_COLUMNS = (('top-1', 'top1', '>6', '.4f'),
                  ('top-5', 'top5', '>6', '.4f'),
                  ('loss', 'loss', '>8', '.4f'))
_CHECKPOINT_TABLE = (('checkpoint', 'checkpoint', '<', ''),
                     ('step', 'step', '>8', ''),
                     ('epoch', 'epoch', '>7', '.2f')) + _SCORE_COLUMNS
_EXPORTS_TABLE = (('export', 'export', '<', ''),
                  ('kind', 'kind', '<14', '')) + _SCORE_COLUMNS + (
                      ('max |p - p_first|', 'max_prob_diff', '', '.2g'),)


def _format(rows: List[Dict], columns) -> str:
  (header, key, align, _), *rest = columns
  width = max(len(header), *(len(str(r[key])) for r in rows))
  columns = [(header, key, f'{align}{width}', '')] + rest
  lines = ['  '.join(format(h, a) for h, _, a, _ in columns)]
  lines += ['  '.join(format(r[k], a + f) for _, k, a, f in columns)
            for r in rows]
  return '\n'.join(lines)


def format_exports_table(rows: List[Dict]) -> str:
  return _format(rows, _EXPORTS_TABLE)


def format_table(rows: List[Dict]) -> str:
  return _format(rows, _CHECKPOINT_TABLE)


def write_csv(path: str, rows: List[Dict], columns=COLUMNS) -> None:
  text = io.StringIO()
  writer = csv.DictWriter(text, fieldnames=columns, lineterminator='\n')
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
  if flags.FLAGS.saved_model:
    if flags.FLAGS.checkpoint:
      raise UsageError('--checkpoint scores checkpoints, --saved_model '
                       'exports: pass one of them')
    rows = score_exports(cfg, flags.FLAGS.saved_model)
    print(format_exports_table(rows))
    path = os.path.join(model_dir, EXPORTS_RESULTS_FILE)
    write_csv(path, rows, EXPORTS_COLUMNS)
  else:
    rows = evaluate_checkpoints(cfg, plan, flags.FLAGS.checkpoint)
    print(format_table(rows))
    path = os.path.join(model_dir, RESULTS_FILE)
    write_csv(path, rows)
  print(f'wrote {path}')


if __name__ == '__main__':
  cli.run_entry_point(main, define_flags)
