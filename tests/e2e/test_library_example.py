"""examples/train_as_a_library.py, as the README points to it: its main
trains the tiny run in this process and reads the run directory back."""

import json
import math
import os

import pytest

from examples import train_as_a_library

pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')


@pytest.mark.slow
def test_the_library_example_trains_and_reads_its_summary_back(tmp_path,
                                                                capsys):
  model_dir = str(tmp_path / 'run')
  summary = train_as_a_library.main(model_dir)
  assert summary['train_steps'] == 4 and summary['global_batch_size'] == 8
  assert math.isfinite(summary['train_loss'])
  assert summary['eval_examples'] == 16
  with open(os.path.join(model_dir, 'config.json')) as f:
    recorded = json.load(f)
  assert recorded['config']['resnet_depth'] == 10
  assert f'{model_dir}: 4 steps of 8 images' in capsys.readouterr().out
