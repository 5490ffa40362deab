"""The builder training and the tools share: what it decides before
building, the plan on this process's layout, and the parts it builds."""

import dataclasses

import pytest
import tensorflow as tf

from resnet_keras.engine import assembly
from resnet_keras.config import RunConfig

CFG = RunConfig(use_synthetic_data=True, resnet_depth=10,
                width_multiplier=0.25, image_size=32, batch_size=4,
                num_train_examples=16, num_eval_examples=6)


pytestmark = pytest.mark.usefixtures('fresh_tensorflow_state')


def test_set_up_decides_the_dtype_and_resolves_the_classes():
  basis = assembly.set_up(RunConfig(use_synthetic_data=True, dtype='auto'),
                          distributed=False)
  assert basis.cfg.dtype in ('fp32', 'bf16', 'fp16')
  assert basis.cfg.num_classes == 0
  assert basis.effective_cfg.num_classes == 1000
  assert basis.runtime_record['dtype'] == basis.cfg.dtype


def test_the_plan_is_made_for_this_process_layout():
  plan = assembly.plan_for(assembly.set_up(CFG))
  assert (plan.global_batch_size, plan.program_batch_size,
          plan.replica_batch_size, plan.num_replicas) == (4, 4, 4, 1)
  assert plan.steps_per_epoch == 4


def test_per_layer_regularisers_only_on_their_weight_decay_path():
  for path, regularised in (('regularizers', True),
                            ('single_l2_loss_op', False), ('none', False)):
    _, model = assembly.build_model(CFG, 5, assembly.set_up(CFG).machine,
                                    weight_decay_path=path)
    assert bool(model.losses) == regularised, path


def test_evaluation_parts_score_every_validation_example(tmp_path):
  cfg = dataclasses.replace(CFG, model_dir=str(tmp_path), num_classes=5)
  basis = assembly.set_up(cfg, distributed=False)
  parts = assembly.assemble_evaluation(basis, assembly.plan_for(basis))
  results = parts.evaluator.evaluate(tf.constant(-1))
  assert results['eval_examples'] == 6
  assert parts.manager.directory == str(tmp_path)
  assert parts.guard is None
