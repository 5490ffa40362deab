"""RunConfig validation, the batch/step arithmetic of a training plan, and
their JSON form (model_dir/config.json)."""

import dataclasses
import json

import pytest

from resnet_keras import config as config_lib
from resnet_keras.config import options
from resnet_keras.config import plan as plan_lib
from resnet_keras.config import RunConfig
from resnet_keras.launcher.launch_config import LaunchConfig
from resnet_keras.config.plan import make_training_plan
from common.errors import UsageError


@pytest.mark.parametrize('field,value,expected', [
    ('dtype', 'fp64', '--dtype=fp64 is not supported; use one of: fp32, bf16, fp16'),
    ('optimizer', 'adam', '--optimizer=adam is not supported; use one of: SGD, '
     'LARS, RMSProp'),
    ('optimizer', 'rmsprop', 'use one of: SGD, LARS, RMSProp'),
    ('lr_schedule', 'step', 'use one of: piecewise, polynomial, constant, '
     'cosine, stepped, exponential'),
    ('norm', 'layer', '--norm=layer is not supported; use one of: batch, group'),
    ('relu_impl', 'fast', '--relu_impl=fast is not supported; use one of: '
     'auto, native, bitwise, xla'),
    ('rmsprop_rho', 1.0, '--rmsprop_rho must be in [0, 1)'),
    ('rmsprop_epsilon', 0.0, '--rmsprop_epsilon must be > 0'),
    ('lr_decay_factor', 1.5, '--lr_decay_factor must be in (0, 1]'),
    ('lr_decay_epochs', 0.0, '--lr_decay_epochs must be > 0'),
    ('lr_decay_points', (0.6, 0.3), '--lr_decay_points must be increasing '
     'fractions of the run in (0, 1), e.g. 0.3,0.6,0.8; got 0.6,0.3'),
    ('lr_decay_points', (0.5, 1.0), 'got 0.5,1.0'),
    ('resnet_depth', 42, 'use one of: 10, 18, 34, 50, 101, 152'),
    ('data_loader_image_type', 'int8', 'use one of: fp32, bf16, uint8'),
    ('batch_size', 0, '--batch_size must be > 0'),
    ('image_size', 16, '--image_size=16 is too small'),
    ('stem', 'deep', '--stem=deep is not supported; use one of: imagenet, '
     'small, cifar'),
    ('stem_init', 'zeros', '--stem_init=zeros is not supported; use one of: '
     'random, pca'),
    ('keras_applications_model', 'ResNet18', 'use one of: ResNet50,'),
    ('distribution_strategy', 'tpu', 'use one of: off, one_device,'),
    ('label_smoothing', 1.5, '--label_smoothing must be in [0, 1)'),
    ('loss', 'focal', '--loss=focal is not supported; use one of: softmax, '
     'bce'),
    ('clip_grad_norm', -1.0, '--clip_grad_norm must be >= 0 (0: off)'),
    ('adam_beta2', 1.0, '--adam_beta2 must be in [0, 1)'),
    ('adam_epsilon', 0.0, '--adam_epsilon must be > 0'),
])
def test_bad_values_name_the_flag_and_the_choices(field, value, expected):
  with pytest.raises(UsageError, match=None) as e:
    RunConfig(**{field: value}).check()
  assert expected in str(e.value)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('kwargs,expected', [
    (dict(norm='group', groups=48), '--groups=48 must divide every channel '
     'count of the ResNet (multiples of 64); use one of: 1, 2, 4, 8, 16, 32, '
     '64'),
    (dict(norm='group', groups=0), '--groups=0 must divide'),
    (dict(norm='group', sync_batch_norm=True), '--sync_batch_norm needs '
     '--norm=batch'),
    (dict(keras_applications_model='ResNet50', norm='group'),
     '--norm=group applies to this project\'s ResNets'),
    (dict(keras_applications_model='ResNet50', sync_batch_norm=True),
     '--sync_batch_norm applies'),
    (dict(keras_applications_model='ResNet50', enable_recompute=True),
     '--enable_recompute applies'),
    (dict(keras_applications_model='ResNet50', zero_init_residual=True),
     '--zero_init_residual applies'),
    (dict(keras_applications_model='ResNet50', blurpool=True),
     '--blurpool applies'),
    (dict(keras_applications_model='ResNet50', stem_init='pca'),
     '--stem_init=pca applies'),
    (dict(use_synthetic_data=True, stem_init='pca'),
     '--stem_init=pca starts the stem from training images, which '
     '--use_synthetic_data has none of'),
    (dict(ema_decay=1.0), '--ema_decay is the decay of the weight average'),
    (dict(ema_decay=-0.1), 'in [0, 1) (0: none), got -0.1'),
    (dict(ema_warmup=True), '--ema_warmup ramps the decay of --ema_decay'),
    (dict(eval_image_size=16), '--eval_image_size=16 is too small'),
    (dict(progressive_resize_start_size=16),
     '--progressive_resize_start_size=16 is too small'),
    (dict(image_size=64, progressive_resize_start_size=96),
     'larger than --image_size=64, where progressive resizing ends'),
    (dict(progressive_resize_start_size=160, progressive_resize_epochs=(3, 1)),
     '0 <= START <= END (epochs counted from 0), got 3,1'),
    (dict(progressive_resize_epochs=(1, 3)),
     '--progressive_resize_epochs needs --progressive_resize_start_size'),
    (dict(progressive_resize_start_size=160, progressive_resize_multiple=-4),
     '--progressive_resize_multiple must be >= 0'),
    (dict(optimizer='RMSProp', nesterov=True), '--nesterov applies to SGD and '
     'LARS'),
    (dict(optimizer='AdamW', nesterov=True), 'AdamW has no Nesterov form'),
    (dict(optimizer='LAMB', single_l2_loss_op=True), 'LAMB decays the '
     'weights inside the optimizer (drop --single_l2_loss_op)'),
    (dict(bce_target_threshold=0.2), '--bce_target_threshold binarises the '
     'targets of --loss=bce'),
    (dict(loss='bce', enable_recompute=True), '--loss=bce trains on the '
     'logits'),
    (dict(num_cpu_replicas=2), '--num_cpu_replicas=2 splits the CPU into '
     'replicas of -ds mirrored; add --distribution_strategy=mirrored (not '
     'off)'),
    (dict(num_cpu_replicas=0, distribution_strategy='mirrored'),
     '--num_cpu_replicas must be > 0'),
])
def test_bad_combinations_are_one_line(kwargs, expected):
  with pytest.raises(UsageError) as e:
    RunConfig(**kwargs).check()
  assert expected in str(e.value)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('groups', [1, 2, 4, 8, 16, 32, 64])
def test_group_counts_dividing_64_are_valid(groups):
  RunConfig(norm='group', groups=groups).check()
  RunConfig(norm='batch', groups=48).check()  # Unused without group norm.


def test_width_multiplier_rounds_channels_to_multiples_of_8():
  assert RunConfig().stage_filters == (64, 128, 256, 512)
  assert RunConfig(width_multiplier=0.25).stage_filters == (16, 32, 64, 128)
  assert RunConfig(width_multiplier=0.3).stage_filters == (16, 40, 80, 152)
  assert RunConfig(width_multiplier=0.01).stage_filters == (8, 8, 8, 8)
  assert RunConfig(width_multiplier=2).stage_filters == (128, 256, 512, 1024)
  # Group norm's groups must divide every scaled count.
  RunConfig(norm='group', groups=8, width_multiplier=0.3).check()
  with pytest.raises(UsageError, match='multiples of 8\\); use one of: 1, 2, '
                     '4, 8'):
    RunConfig(norm='group', groups=16, width_multiplier=0.3).check()
  for bad, message in ((dict(width_multiplier=0), 'must be > 0'),
                       (dict(width_multiplier=0.5,
                             keras_applications_model='ResNet50'),
                        'width_multiplier applies to this project.s ResNets')):
    with pytest.raises(UsageError, match=message):
      RunConfig(**bad).check()


def test_stage_widths_replace_the_multiplier_and_name_the_model():
  cfg = RunConfig(resnet_depth=10, width_multiplier=0.5,
                  stage_widths=(24, 48, 96, 192))
  cfg.check()
  assert cfg.stage_filters == (24, 48, 96, 192)
  # Resume and warm start compare models by name: another shape, another
  # name.
  assert cfg.model_name == 'resnet10_c24-48-96-192'
  assert RunConfig(resnet_depth=10, width_multiplier=0.5).model_name == (
      'resnet10_w0.5')
  for bad, message in ((dict(stage_widths=(24, 48, 96)), 'channels of the 4 '
                        'stages, each >= 1 .e.g. 24,48,96,192., got 24,48,96'),
                       (dict(stage_widths=(24, 0, 96, 192)), 'got 24,0,96'),
                       (dict(stage_widths=(8, 8, 8, 8),
                             keras_applications_model='ResNet50'),
                        'stage_widths applies to this project.s ResNets')):
    with pytest.raises(UsageError, match=message):
      RunConfig(**bad).check()


def test_smaller_stems_allow_smaller_images():
  RunConfig(stem='small', image_size=16).check()
  RunConfig(stem='cifar', image_size=8).check()
  with pytest.raises(UsageError, match='use --image_size >= 16'):
    RunConfig(stem='small', image_size=12).check()


def test_while_loop_needs_tf_function():
  with pytest.raises(UsageError, match='--use_tf_while_loop'):
    RunConfig(use_tf_function=False).check()
  RunConfig(use_tf_function=False, use_tf_while_loop=False).check()


def test_defaults_are_valid():
  RunConfig().check()


def test_plan_arithmetic():
  cfg = RunConfig(batch_size=256, train_epochs=3, steps_per_loop=1000,
                  epochs_between_evals=2)
  plan = make_training_plan(cfg, 1281167, 50000)
  assert plan.steps_per_epoch == 5004            # 1281167 // 256
  assert plan.total_train_steps == 15012
  assert plan.steps_per_loop == 1000
  assert plan.eval_interval_steps == 10008
  assert plan.eval_steps == 196                  # ceil(50000 / 256)
  assert plan.epoch_of(2502) == 0.5


def test_plan_caps_steps_per_loop_and_train_steps():
  cfg = RunConfig(batch_size=10, train_steps=7, steps_per_loop=50)
  plan = make_training_plan(cfg, 1000, 25)
  assert plan.steps_per_epoch == 7
  assert plan.steps_per_loop == 7
  assert plan.eval_steps == 3


def test_plan_counts_horovod_workers_in_global_batch():
  plan = make_training_plan(RunConfig(batch_size=256), 1281167, 50000,
                            num_programs=8)
  assert plan.global_batch_size == 2048
  assert plan.program_batch_size == 256
  assert plan.steps_per_epoch == 625


def test_plan_owns_every_batch_size():
  plan = make_training_plan(RunConfig(batch_size=64, num_accumulation_steps=4),
                            10000, 100, num_programs=2, replicas_per_program=2)
  assert (plan.global_batch_size, plan.program_batch_size,
          plan.replica_batch_size, plan.micro_batch_size) == (128, 64, 32, 8)
  assert plan.num_replicas == 4


def test_a_planned_global_batch_keeps_the_planned_steps_and_scales_lr():
  # An elastic job planned for 3 Horovod workers x 8 now runs on 2: epochs
  # of 1000 // 24 = 41 steps of 16 examples, the LR x 16/24.
  plan = make_training_plan(
      RunConfig(batch_size=8, train_epochs=2, planned_global_batch=24), 1000,
      10, num_programs=2)
  assert (plan.global_batch_size, plan.steps_per_epoch,
          plan.total_train_steps) == (16, 41, 82)
  assert plan.lr_scale == pytest.approx(2 / 3)
  assert make_training_plan(RunConfig(batch_size=8), 1000, 10).lr_scale == 1


def test_batch_not_divisible_by_replicas_is_a_usage_error():
  with pytest.raises(UsageError, match=r'^--batch_size=10 is the global batch '
                     'and must be divisible by the 4 replicas$'):
    make_training_plan(RunConfig(batch_size=10), 100, 10,
                       replicas_per_program=4)


def test_replica_batch_not_divisible_into_micro_batches_is_a_usage_error():
  with pytest.raises(UsageError, match='multiple of 6$'):
    make_training_plan(RunConfig(batch_size=8, num_accumulation_steps=3), 100,
                       10, replicas_per_program=2)


def test_plan_of_an_older_config_json_is_one_program_one_replica():
  plan = make_training_plan(RunConfig(batch_size=10), 100, 10)
  fields = dataclasses.asdict(plan)
  for name in ('num_programs', 'replicas_per_program', 'num_micro_batches',
               'planned_global_batch_size'):
    del fields[name]
  assert config_lib.from_dict(plan_lib.TrainingPlan, fields) == plan


def test_batch_larger_than_dataset_is_a_usage_error():
  with pytest.raises(UsageError, match='larger than the training set'):
    make_training_plan(RunConfig(batch_size=64), 10, 10)


def test_plan_checkpoint_and_stop_steps():
  plan = make_training_plan(RunConfig(batch_size=10, train_epochs=2,
                                      checkpoint_interval_steps=3), 100, 10)
  assert plan.steps_per_epoch == 10 and plan.total_train_steps == 20
  stops, step = [], 0
  while step < plan.total_train_steps:
    step = plan.next_stop(step)
    stops.append(step)
  assert stops == [3, 6, 9, 10, 12, 15, 18, 20]
  assert [s for s in stops if plan.is_checkpoint_step(s)] == stops
  assert not plan.is_checkpoint_step(4)
  per_epoch = make_training_plan(RunConfig(batch_size=10, train_epochs=2),
                                 100, 10)
  assert per_epoch.next_stop(3) == 10 and not per_epoch.is_checkpoint_step(9)


@pytest.mark.parametrize('epochs,every,offset,expected', [
    (10, 1, 0, list(range(1, 11))),
    (10, 4, 0, [4, 8, 10]),          # and always the end
    (10, 4, 3, [3, 7, 10]),          # MLPerf style: 3, 7, 11, ...
    (10, 10, 0, [10]),
    (5, 2, 9, [5]),                  # an offset past the end: the end only
])
def test_eval_epochs(epochs, every, offset, expected):
  plan = make_training_plan(RunConfig(batch_size=10, train_epochs=epochs,
                                      epochs_between_evals=every,
                                      eval_offset_epochs=offset), 50, 10)
  steps = range(1, plan.total_train_steps + 1)
  assert [plan.epoch_of(s) for s in steps if plan.is_eval_step(s)] == expected


def test_config_and_plan_survive_json():
  cfg = RunConfig(resnet_depth=18, num_classes=7, profile_steps=(2, 4),
                  keras_applications_model=None, eval_crop_fraction=0.5)
  plan = make_training_plan(cfg, 1000, 130)
  for record in (cfg, plan):
    text = json.dumps(dataclasses.asdict(record))
    assert config_lib.from_dict(type(record), json.loads(text)) == record


def test_config_from_another_version_loads():
  values = dataclasses.asdict(RunConfig(resnet_depth=34))
  del values['stem']                       # a field this version added
  values['retired_flag'] = True            # a field this version removed
  cfg = config_lib.from_dict(RunConfig, values)
  assert cfg.resnet_depth == 34 and cfg.stem == RunConfig().stem


@pytest.mark.parametrize('group', config_lib.GROUPS + (LaunchConfig,),
                         ids=lambda group: group.__name__)
def test_every_choice_is_named_in_its_flags_help(group):
  """--helpfull lists what a flag takes: a choice added without its words
  in the help (or a help written by hand that drifts) shows here."""
  for field in options.fields_of(group):
    spec = options.spec_of(field)
    if spec.choices:
      missing = [c for c in spec.choices if str(c) not in spec.help]
      assert not missing, (field.name, missing)


def test_one_of_lists_the_choices_with_their_words():
  assert options.one_of(('SGD', 'LARS', 'LAMB'), {'SGD': 'momentum'}) == (
      'SGD (momentum), LARS or LAMB')
  assert options.one_of((10, 18)) == '10 or 18'
  assert options.one_of(('only',)) == 'only'
