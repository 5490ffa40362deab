"""Scores a run's checkpoints, or its exports, on its validation data (the
validate tool, resnet_keras/validate.py; the average tool scores its
average with it).

Checkpoints are scored by the trainer's own evaluation (evaluator.py): the
same input pipeline and the same metrics, every validation example once, so
the run's last checkpoint scores what its last evaluation logged. Exports
(SavedModel directories, ONNX or TFLite files: serving/readers.py) are each
scored on the same uint8 pixels of the same validation images, with the
largest difference of its probabilities from the first export's. Results
are rows: printed as tables and written as CSV files.
"""

import csv
import io
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from resnet_keras import files
from common.errors import UsageError
from resnet_keras.engine import assembly
from resnet_keras.rundir import checkpoints
from resnet_keras.engine import evaluator
from resnet_keras.rundir import run_directory
from resnet_keras.config import RunConfig
from resnet_keras.data import datasets
from resnet_keras.config.plan import TrainingPlan
from resnet_keras.serving import readers

RESULTS_FILE = run_directory.VALIDATION_FILE
COLUMNS = ('checkpoint', 'step', 'epoch', 'top1', 'top5', 'loss', 'examples')
EXPORTS_RESULTS_FILE = run_directory.VALIDATION_EXPORTS_FILE
EXPORTS_COLUMNS = ('export', 'kind', 'step', 'top1', 'top5', 'loss',
                   'examples', 'max_prob_diff')


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
    self.ema = parts.ema
    self._evaluator = parts.evaluator

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
  exports = [readers.load(path) for path in paths]
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
        probs = evaluator.flip_average(
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


def validate(cfg: RunConfig, plan: TrainingPlan, which: Optional[str],
             exports: Optional[Sequence[str]] = None) -> Tuple[str, str]:
  """Scores the checkpoints `which` names or, given, the `exports` instead,
  into the run's validation.csv or validation_exports.csv; returns the
  table and the file's path."""
  if exports:
    if which:
      raise UsageError('--checkpoint scores checkpoints, --saved_model '
                       'exports: pass one of them')
    rows = score_exports(cfg, exports)
    path = os.path.join(cfg.model_dir, EXPORTS_RESULTS_FILE)
    write_csv(path, rows, EXPORTS_COLUMNS)
    return format_exports_table(rows), path
  rows = evaluate_checkpoints(cfg, plan, which)
  path = os.path.join(cfg.model_dir, RESULTS_FILE)
  write_csv(path, rows)
  return format_table(rows), path


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
  files.write_text_atomically(path, text.getvalue())
