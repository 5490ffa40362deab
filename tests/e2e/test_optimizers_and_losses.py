"""--optimizer AdamW|LAMB, --clip_grad_norm and --loss bce in whole runs
(run.run in this process): they train to finite losses, record their
config, checkpoint their slots and evaluate the softmax. (Their exact
resume, with every other technique: test_training_techniques.py; their
arithmetic against hand-computed values: unit/.)"""

import json

import numpy as np
import pytest

from resnet_keras.training import run as run_lib
from resnet_keras.config import RunConfig
from tests.support import runner


pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')

# "ResNet strikes back"'s LAMB, gradient clipping and thresholded BCE.
RSB = dict(optimizer='LAMB', clip_grad_norm=1.0, loss='bce',
           bce_target_threshold=0.2, label_smoothing=0.1, weight_decay=0.02,
           base_learning_rate=6.25e-4)


def _tiny(model_dir, **overrides) -> RunConfig:
  """2 steps of 4 synthetic images an epoch in one loop, 5 classes, 6
  evaluation examples, seed 1, a checkpoint each epoch."""
  return runner.tiny_config(model_dir, **{
      'num_classes': 5, 'batch_size': 4, 'train_steps': 2,
      'steps_per_loop': 2, 'log_steps': 1, 'num_eval_examples': 6,
      'global_seed': 1, 'enable_checkpoint_and_export': True, **overrides})


def test_lamb_with_bce_trains_evaluates_the_softmax_and_records_itself(
    tmp_path):
  summary = run_lib.run(_tiny(tmp_path / 'lamb', **RSB))
  assert np.isfinite(summary['train_loss'])
  # Evaluation scores the softmax: its loss is the cross-entropy of
  # probabilities, not the BCE summed over 5 classes (~5 ln 2 at first).
  assert 0 < summary['eval_loss'] < 3.0
  with open(tmp_path / 'lamb' / 'config.json') as f:
    recorded = json.load(f)['config']
  assert {k: recorded[k] for k in RSB} == RSB
  final = runner.checkpoint_values(str(tmp_path / 'lamb' / 'ckpt-2'))
  slots = {n.split('/.OPTIMIZER_SLOT/optimizer/')[1].split('/')[0]
           for n in final if '/.OPTIMIZER_SLOT/' in n}
  assert slots == {'m', 'v'}


def test_adamw_trains_with_gradient_accumulation(tmp_path):
  summary = run_lib.run(_tiny(
      tmp_path / 'adamw', optimizer='AdamW', weight_decay=0.05,
      base_learning_rate=1e-3, num_accumulation_steps=2, batch_size=8,
      enable_checkpoint_and_export=False, skip_eval=True))
  assert summary['train_steps'] == 2
  assert np.isfinite(summary['train_loss'])
