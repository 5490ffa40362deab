"""The time-to-accuracy techniques together (--zero_init_residual,
--ema_decay, --eval_flip, progressive resizing with --eval_image_size,
--blurpool, the linear schedule by epoch, label smoothing, the PCA stem)
and timm's (RandAugment, random erasing, repeated augmentation, mixup and
CutMix, drop path, LAMB with clipping, BCE) in one run on ImageNet-format records (support/runner.py's TECHNIQUES): it
trains at each epoch's size, evaluates and exports the weight average at
its own size, and resumes exactly."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.support import runner
from tests.support.runner import TECHNIQUES

pytestmark = pytest.mark.slow


def _train(data_dir, model_dir, epochs):
  result = runner.run_main(TECHNIQUES + [f'--data_dir={data_dir}',
                                         f'--model_dir={model_dir}',
                                         f'--train_epochs={epochs}'])
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_all_techniques_train_together_and_resume_exactly(records_run,
                                                          tmp_path):
  data_dir, _ = records_run
  straight_dir, resumed_dir = tmp_path / 'straight', tmp_path / 'resumed'
  straight = _train(data_dir, straight_dir, 3)
  for size, epoch, step in ((28, 1, 4), (32, 2, 8)):
    assert (f'progressive resizing: training at {size} px from epoch '
            f'{epoch} (step {step})') in straight.stderr
  assert ('training at 24 px until epoch 0, rising to 32 px at epoch 2 in '
          'multiples of 4; evaluation at 40 px') in straight.stderr
  assert 'evaluations score the weight average' in straight.stderr
  assert 'stem: 6 of its 16 filters start as' in straight.stderr

  # The straight run as it stood at its epoch-1 checkpoint (its config and
  # ckpt-4: a job interrupted there) resumes in epoch 1, at epoch 1's size,
  # and goes on as the straight run did: the same weights, averages,
  # optimizer state and evaluation.
  runner.copy_run_up_to(str(straight_dir), 4, str(resumed_dir))
  resumed = _train(data_dir, resumed_dir, 3)
  assert 'training at 28 px from epoch 1 (step 4)' in resumed.stderr
  assert 'stem:' not in resumed.stderr  # its weights are the checkpoint's
  summaries = [runner.read_summary(d) for d in (straight_dir, resumed_dir)]
  assert summaries[1]['resumed_from_step'] == 4
  assert summaries[0]['weights_sha256'] == summaries[1]['weights_sha256']
  for key in ('eval_accuracy', 'eval_loss', 'eval_examples'):
    assert summaries[0][key] == summaries[1][key], key
  final = [runner.checkpoint_values(str(d / 'ckpt-12'))
           for d in (straight_dir, resumed_dir)]
  assert any(n.startswith('weight_average/') for n in final[0])
  assert final[0].keys() == final[1].keys()
  for name in final[0]:
    np.testing.assert_array_equal(final[0][name], final[1][name],
                                  err_msg=name)

  # The export serves the weight average at the evaluation size.
  loaded = tf.saved_model.load(str(straight_dir / 'saved_model'))
  spec = loaded.signatures['serving_default'].structured_input_signature[1]
  assert spec['images'].shape.as_list() == [None, 40, 40, 3]
  # Without drop path, also in its training mode (to fine-tune it).
  # (With it, 5 calls would all drop the same branches in ~2% of runs.)
  images = tf.random.uniform([4, 40, 40, 3], 0, 255, seed=1)
  first = loaded(images, training=True)
  for _ in range(4):
    np.testing.assert_array_equal(first, loaded(images, training=True))
  with open(os.path.join(straight_dir, 'config.json')) as f:
    recorded = json.load(f)['config']
  assert recorded['progressive_resize_epochs'] == [0, 2]
  assert recorded['blurpool'] and recorded['zero_init_residual']
  assert recorded['randaugment'] == 'rand-m9-n2-mstd0.5-inc1'
  assert (recorded['drop_path_rate'], recorded['loss']) == (0.1, 'bce')
  # Training metrics on mixed batches say so.
  assert 'accuracy on mixed targets' in straight.stderr
