"""Averages a run's checkpoints into a new checkpoint, and scores it (the
average tool, resnet_keras/average.py).

Every variable of the model is averaged, batch-norm moving statistics
included, over the checkpoints chosen, in step order: their mean, or an
exponential moving average avg = decay * avg + (1 - decay) * w starting
from the oldest (the tool's --ema). A run trained with --ema_decay is
scored by its weight average, so that is what is averaged (and the result's
weight average is the result). The optimizer (slots and step) is the last
checkpoint's, so the result is named like it (ckpt-<step>). It goes to a
directory of its own with a copy of the run's config.json and
averaging.json (method and source checkpoints), so training in the run's
model_dir never resumes from it, while validate, --restore_from and
--pretrained_checkpoint take it like a run's model_dir.
"""

import contextlib
import dataclasses
import json
import os
from typing import Iterable, List, Optional, Sequence

import numpy as np

from resnet_keras import files
from common.errors import UsageError
from resnet_keras.rundir import checkpoints
from resnet_keras.optimization import optimizers
from resnet_keras.rundir import ownership
from resnet_keras.rundir import run_directory
from resnet_keras.tools import scoring
from resnet_keras.optimization import ema as ema_lib
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan
from resnet_keras.serving import saved_model

OUTPUT_DIR = run_directory.AVERAGED_DIR
RECORD_FILE = run_directory.AVERAGING_FILE


def check_ema_decay(decay: Optional[float]) -> None:
  if decay is not None and not 0 < decay < 1:
    raise UsageError(f'--ema={decay} is not a decay; use a fraction in (0, 1) '
                     '(e.g. 0.9: each newer checkpoint weighs 0.1)')


def select_last(kept: Sequence[str], last: Optional[int],
                model_dir: str) -> List[str]:
  """The last `last` of the checkpoints kept (oldest first); None: all."""
  if last is None:
    return list(kept)
  if not 1 <= last <= len(kept):
    names = ', '.join(os.path.basename(p) for p in kept)
    raise UsageError(f'--last={last}: {model_dir} keeps {len(kept)} '
                     f'checkpoints ({names}); use 1 to {len(kept)}')
  return list(kept[-last:])


def average_weights(weight_sets: Iterable[Sequence[np.ndarray]],
                    ema_decay: Optional[float] = None) -> List[np.ndarray]:
  """The mean (or EMA, oldest first) of same-shaped weight lists, in float64.

  Iterated once, so only the running average is held in memory.
  """
  average, count = None, 0
  for weights in weight_sets:
    weights = [np.asarray(w, np.float64) for w in weights]
    count += 1
    if average is None:
      average = weights
    elif ema_decay is None:  # Running mean.
      average = [a + (w - a) / count for a, w in zip(average, weights)]
    else:
      average = [ema_decay * a + (1 - ema_decay) * w
                 for a, w in zip(average, weights)]
  if average is None:
    raise ValueError('no weights to average')
  return average


def describe_method(paths: Sequence[str], ema_decay: Optional[float]) -> str:
  names = ', '.join(os.path.basename(p) for p in paths)
  if ema_decay is None:
    return f'mean of {len(paths)} ({names})'
  return f'EMA {ema_decay:g} of {len(paths)} ({names})'


def output_dir_for(model_dir: str, output_dir: Optional[str]) -> str:
  """Where the average goes: MODEL_DIR/averaged, or --output_dir, which
  must be new, empty or an earlier average of this run (not the run
  itself, nor another run, whose training would resume from it)."""
  default = os.path.join(model_dir, OUTPUT_DIR)
  output_dir = output_dir or default
  if os.path.realpath(output_dir) == os.path.realpath(model_dir):
    raise UsageError(f'--output_dir={output_dir} is the run\'s model_dir, '
                     'whose training would resume from the average; use '
                     'another directory (default: MODEL_DIR/averaged)')
  if os.path.realpath(output_dir) != os.path.realpath(default):
    ownership.check_new_or_own(output_dir, '--output_dir',
                               lambda path: _is_average_of(path, model_dir))
  return output_dir


def _is_average_of(output_dir: str, model_dir: str) -> bool:
  """Whether output_dir holds an average of model_dir's checkpoints (its
  averaging.json says so)."""
  try:
    with open(os.path.join(output_dir, RECORD_FILE)) as f:
      sources = json.load(f)['sources']
    return bool(sources) and all(
        os.path.realpath(os.path.dirname(source)) ==
        os.path.realpath(model_dir) for source in sources)
  except (OSError, ValueError, KeyError, TypeError):
    return False


def write_averaged(evaluator: scoring.CheckpointEvaluator,
                   paths: Sequence[str], ema_decay: Optional[float],
                   output_dir: str) -> str:
  """Averages `paths` into output_dir; returns the new checkpoint's path."""
  cfg = evaluator.cfg
  # A model_dir of this model for every tool: no average of another model
  # joins the checkpoints there.
  checkpoints.check_resumable(output_dir, cfg)
  # Slots exist before restoring, so they are restored (not deferred) and
  # the last checkpoint's are saved with the average.
  optimizers.create_slots(evaluator.optimizer,
                          evaluator.model.trainable_variables)
  variables = evaluator.model.variables
  kept_average = evaluator.ema

  def restored_weights():
    for path in paths:
      evaluator.restore(path)
      # What the run scored: an --ema_decay run's weight average.
      with ema_lib.in_model(kept_average):
        yield [v.numpy() for v in variables]

  for variable, value in zip(variables,
                             average_weights(restored_weights(), ema_decay)):
    variable.assign(value.astype(variable.dtype.as_numpy_dtype))
  if kept_average:  # Scored and exported from the checkpoint as written.
    kept_average.reset()
  os.makedirs(output_dir, exist_ok=True)
  checkpoints.record_config(output_dir, dataclasses.replace(
      cfg, model_dir=output_dir), evaluator.plan)
  manager = checkpoints.make_manager(evaluator.model, evaluator.optimizer,
                                     output_dir,
                                     max_to_keep=cfg.max_checkpoints,
                                     ema=kept_average)
  path = manager.save(
      checkpoint_number=int(evaluator.optimizer.iterations.numpy()))
  files.write_json_atomically(
      os.path.join(output_dir, RECORD_FILE),
      {'checkpoint': os.path.basename(path),
       'method': 'mean' if ema_decay is None else 'ema',
       'ema_decay': ema_decay, 'sources': list(paths)})
  return path


def average_run(model_dir: str, last: Optional[int],
                ema_decay: Optional[float], output_dir: Optional[str],
                export: bool) -> None:
  """Averages the last `last` (None: all) checkpoints of the run in
  model_dir into output_dir (None: MODEL_DIR/averaged), with `export` a
  SavedModel of it too, and scores it beside the last checkpoint; says
  each step as it ends."""
  check_ema_decay(ema_decay)
  output_dir = output_dir_for(model_dir, output_dir)
  cfg, plan = checkpoints.read_config(model_dir)
  # Before any work: the average's directory held, and the run too where
  # the average goes into it (its averaged/).
  inside = os.path.realpath(output_dir).startswith(
      os.path.join(os.path.realpath(model_dir), ''))
  with (ownership.take(model_dir, 'resnet_keras.average', new_run=False)
        if inside else contextlib.nullcontext()), \
      ownership.take(output_dir, 'resnet_keras.average',
                     flag='--output_dir'):
    _average_into(cfg, plan, model_dir, last, ema_decay, output_dir, export)


def _average_into(cfg: RunConfig, plan: TrainingPlan, model_dir: str,
                  last: Optional[int], ema_decay: Optional[float],
                  output_dir: str, export: bool) -> None:
  evaluator = scoring.CheckpointEvaluator(cfg, plan)
  paths = select_last(
      checkpoints.checkpoint_paths(evaluator.manager, model_dir, 'all'),
      last, model_dir)
  averaged = write_averaged(evaluator, paths, ema_decay, output_dir)
  print(f'wrote {averaged}: {describe_method(paths, ema_decay)}')
  if export:  # The model holds the average until evaluated.
    path, = saved_model.export_run(evaluator.network, cfg, output_dir)
    print(f'exported {path}')
  rows = [evaluator.evaluate(paths[-1]), evaluator.evaluate(averaged)]
  rows[1]['checkpoint'] = os.path.relpath(averaged, model_dir)
  print(scoring.format_table(rows))
  scoring.write_csv(os.path.join(output_dir, scoring.RESULTS_FILE), rows)
