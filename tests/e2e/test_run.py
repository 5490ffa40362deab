"""run.run in this process, on a tiny synthetic RunConfig: what a run writes
and returns, and how a second run in the same model_dir resumes it.

test_main.py covers the entry point; these call the library as a notebook
or another program would.
"""

import gc
import json
import os

import numpy as np
import pytest
from tensorflow.python.data.ops import iterator_ops
import tf_keras

from common.errors import UsageError
from resnet_keras.training import run as run_lib
from resnet_keras.rundir import run_directory
from tests.support import runner


pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')

# What these tests count on, where the tiny recipe differs: 2 steps of 4
# synthetic images, 5 classes, 6 evaluation examples (a partial last
# batch), a log record every step, seed 1.
SMALL = dict(num_classes=5, batch_size=4, train_steps=2, log_steps=1,
             num_eval_examples=6, global_seed=1)


def _live_iterators():
  return {id(o) for o in gc.get_objects()
          if isinstance(o, iterator_ops.OwnedIterator)}


def test_a_run_trains_evaluates_records_and_resumes(tmp_path):
  model_dir = tmp_path / 'run'
  iterators = _live_iterators()
  summary = run_lib.run(runner.tiny_config(model_dir, **SMALL,
                                           enable_checkpoint_and_export=True))
  # Its input iterators are gone as it returns: left to a later garbage
  # collection, destroying one blocked that code for up to a minute.
  assert not _live_iterators() - iterators
  assert summary['train_steps'] == 2 and summary['resumed_from_step'] == 0
  assert summary['global_batch_size'] == 4 and summary['num_replicas'] == 1
  assert summary['eval_examples'] == 6  # the partial last batch counts
  assert np.isfinite(summary['train_loss'])
  assert np.isfinite(summary['eval_accuracy'])
  with open(model_dir / run_directory.SUMMARY_FILE) as f:
    assert json.load(f) == summary
  with open(model_dir / 'config.json') as f:
    recorded = json.load(f)
  assert recorded['config']['num_classes'] == 5
  assert recorded['training_plan']['global_batch_size'] == 4
  assert (model_dir / 'ckpt-2.index').exists()
  assert (model_dir / 'saved_model' / 'saved_model.pb').exists()

  tf_keras.backend.clear_session()
  resumed = run_lib.run(runner.tiny_config(model_dir, **SMALL, train_epochs=2))
  assert resumed['resumed_from_step'] == 2
  assert resumed['train_steps'] == 4
  with open(model_dir / 'metrics.jsonl') as f:
    steps = [json.loads(line).get('step') for line in f]
  assert steps.count(3) == 1 and steps.count(4) >= 1


def test_a_batch_the_replicas_cannot_share_stops_before_training(tmp_path):
  with pytest.raises(UsageError, match='micro-batches'):
    run_lib.run(runner.tiny_config(tmp_path / 'run', **SMALL,
                                   num_accumulation_steps=3))
  assert not os.path.exists(tmp_path / 'run' / 'metrics.jsonl')
