"""Recipes (--config) through the entry points' mains in this process
(support/runner.py): every shipped recipe printed and read back
(--print_config), the launcher's
recipes and presets, one-line errors, recipes that train. (Applying a
recipe to flags: unit/.)"""

import importlib
import json
import os

import pytest
import yaml

from resnet_keras.config import hardware
from resnet_keras.config import recipes
from tests.support import runner
from tests.support.records import write_dataset

MAIN, DEMO = 'resnet_ctl_imagenet_main', 'demo_resnet_keras'
LAUNCHER_RECIPES = ('resnet50_lars_8workers', 'resnet50_lars_16workers',
                    'resnet50_lars_32workers', 'resnet50_mlperf_lars')


@pytest.mark.parametrize('points', [[0.2, 0.7], '0.2,0.7'])
def test_decay_points_from_a_yaml_list_or_text(points, tmp_path):
  path = tmp_path / 'stepped.yaml'
  path.write_text(yaml.safe_dump({'lr_schedule': 'stepped',
                                  'lr_decay_points': points,
                                  'norm': 'group', 'groups': 16}))
  values = yaml.safe_load(_print_config(MAIN, ['--config', str(path)]))
  assert values['lr_decay_points'] == '0.2,0.7'
  assert values['norm'] == 'group' and values['groups'] == 16


def _call(entry_point, args):
  return runner.call(importlib.import_module(entry_point), args)


def _print_config(entry_point, args):
  result = _call(entry_point, list(args) + ['--print_config'])
  assert result.returncode == 0, result.stderr
  return result.stdout


@pytest.mark.parametrize('name', sorted(
    set(recipes.available()) - set(LAUNCHER_RECIPES)))
def test_single_process_recipes_print_and_read_back(name, tmp_path):
  printed = _print_config(MAIN, ['--config', name])
  values = yaml.safe_load(printed)
  with open(os.path.join(recipes.RECIPES_DIR, f'{name}.yaml')) as f:
    recipe = yaml.safe_load(f)
  # A recipe's fp32 block counts where this machine trains it in fp32.
  dtype, _ = hardware.dtype_here(recipe.get('dtype', 'fp32'))
  for key, value in recipes.for_dtype(recipe, dtype).items():
    if isinstance(value, list):  # A YAML list is the flag's a,b,c.
      value = ','.join(str(item) for item in value)
    assert values[key] == value, key
  # The printed configuration is itself a recipe giving the same run.
  path = tmp_path / 'effective.yaml'
  path.write_text(printed)
  assert _print_config(MAIN, ['--config', str(path)]) == printed


@pytest.mark.parametrize('name', LAUNCHER_RECIPES)
def test_multi_worker_recipes_need_the_launcher(name):
  result = runner.run_main(['--config', name])
  runner.assert_one_line_error(result, 'num_workers_per_hls',
                               'demo_resnet_keras.py')
  values = yaml.safe_load(_print_config(DEMO, ['--config', name]))
  assert values['num_workers_per_hls'] == 8 and values['use_horovod']


def test_reference_recipe_values():
  one = yaml.safe_load(_print_config(MAIN, ['--config',
                                                   'resnet50_lars_1worker']))
  assert (one['optimizer'], one['base_learning_rate'], one['batch_size'],
          one['train_epochs']) == ('LARS', 2.5, 256, 40)
  big = yaml.safe_load(_print_config(DEMO, ['--config',
                                            'resnet50_lars_32workers']))
  assert (big['base_learning_rate'], big['warmup_epochs'],
          big['lars_decay_epochs'], big['train_epochs'],
          big['steps_per_loop']) == (17.0, 5.0, 43.0, 42, 1000)
  mlperf = yaml.safe_load(_print_config(DEMO, ['--config',
                                               'resnet50_mlperf_lars']))
  assert mlperf['batch_size'] * mlperf['num_workers_per_hls'] == 2048
  assert (mlperf['target_accuracy'], mlperf['epochs_between_evals'],
          mlperf['eval_offset_epochs']) == (0.759, 4, 3)


def test_launcher_recipe_beats_the_preset_and_flags_beat_both():
  result = _call(DEMO, ['--config', 'resnet50_lars_16workers',
                        '--warmup_epochs', '2', '--dry_run'])
  assert result.returncode == 0, result.stderr
  command = next(l for l in result.stdout.splitlines()
                 if l.startswith('command: '))
  # The LARS preset for several workers says 9.5 and 3 warmup epochs.
  assert '--base_learning_rate=13.0' in command
  assert '--base_learning_rate=9.5' not in command
  # The user's value, joined to its flag as absl read it; no preset's.
  assert '--warmup_epochs=2' in command
  assert command.count('--warmup_epochs') == 1
  assert '-np 8' in command and '--config' not in command
  assert 'HOROVOD_HIERARCHICAL_ALLREDUCE=1' in result.stdout


@pytest.mark.parametrize('args,fragments', [
    (['--config', 'no_such_recipe'], ['--config=no_such_recipe',
                                      'resnet50_lars_1worker']),
    (['--config', '{bad'], ['cannot be read as YAML']),
    (['--config', '[1, 2]'], ['must be a mapping']),
    (['--config', 'batch_size: many'], ['batch_size must be a int']),
    (['--config', 'bogus: 1'], ['unknown key "bogus"']),
])
def test_bad_recipes_are_one_line(tmp_path, args, fragments):
  if args[1] != 'no_such_recipe':
    path = tmp_path / 'recipe.yaml'
    path.write_text(args[1])
    args = ['--config', str(path)]
  for entry_point in (MAIN, DEMO):
    result = _call(entry_point, args + ['--print_config'])
    runner.assert_one_line_error(result, *fragments)


def test_the_quick_start_recipe_trains_with_overrides(tmp_path):
  # The recipe scripts/fashion_mnist_demo.sh runs, as written but for its
  # batch and length: whole-image training from the decoded cache, flip
  # evaluation.
  with open(os.path.join(runner.REPO_ROOT, 'scripts',
                         'fashion_mnist_demo.sh')) as f:
    assert 'FMNIST_RECIPE:-fashion_mnist_fast}' in f.read()
  data_dir = str(tmp_path / 'data')
  write_dataset(data_dir)
  model_dir = str(tmp_path / 'run')
  result = runner.run_main(['--config', 'fashion_mnist_fast', '-dd', data_dir,
                            '-md', model_dir, '-bs', '4', '-te', '1',
                            '--steps_per_loop', '2', '--log_steps', '2'])
  assert result.returncode == 0, result.stderr
  with open(os.path.join(model_dir, 'config.json')) as f:
    effective = json.load(f)['config']
  # --dtype auto: bf16 where this CPU has bf16 hardware, else fp32 and the
  # recipe's fp32 block's narrower stages.
  dtype = hardware.dtype_here('auto')[0]
  widths = {'bf16': [32, 64, 128, 128], 'fp32': [24, 48, 96, 128]}[dtype]
  assert (effective['dtype'], effective['stem'], effective['image_size'],
          effective['lr_schedule'], effective['batch_size'],
          effective['resnet_depth'], effective['stage_widths'],
          effective['nesterov'], effective['train_crop_min_area'],
          effective['eval_flip'], effective['training_dataset_cache'],
          effective['stem_init']) == (
              dtype, 'small', 28, 'linear', 4, 10, widths, True, 1.0, True,
              True, 'pca')
  # The PCA stem from the fixture's training images: flat colours, so their
  # patches vary along the 3 colours only.
  assert (f'stem: 6 of its {widths[0]} filters start as +/- the 3 principal '
          'directions of 3x3 patches of 17 training images') in result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['train_steps'] == 4 and summary['eval_examples'] == 7


@pytest.mark.slow
def test_an_ffcv_recipe_trains_at_its_sizes_on_synthetic_data(tmp_path):
  """resnet50_ffcv_16epochs as written (BlurPool, flip evaluation at 256
  px, linear schedule, its sizes), its batch and run shortened: two epochs
  of one step, its ramp moved to them, so both sizes train; a ResNet-10
  (rsb_a1's test builds a ResNet-50's graph; three of them here took a
  minute)."""
  assert recipes.load(recipes.resolve('resnet50_ffcv_16epochs'))[
      'resnet_depth'] == 50
  model_dir = str(tmp_path / 'run')
  result = runner.run_main([
      '--config', 'resnet50_ffcv_16epochs', '-synth', '-md', model_dir,
      '-bs', '2', '-te', '2', '--train_steps', '1', '--steps_per_loop', '1',
      '--num_eval_examples', '2', '--num_classes', '10',
      '--progressive_resize_epochs', '0,1', '--dtype', 'fp32',
      '--resnet_depth', '10'])
  assert result.returncode == 0, result.stderr[-3000:]
  for size, epoch in ((160, 0), (192, 1)):
    assert (f'progressive resizing: training at {size} px from epoch '
            f'{epoch}') in result.stderr
  with open(os.path.join(model_dir, 'config.json')) as f:
    effective = json.load(f)['config']
  assert (effective['resnet_depth'], effective['blurpool'],
          effective['eval_image_size'], effective['eval_flip'],
          effective['lr_schedule']) == (10, True, 256, True, 'linear')
  assert runner.read_summary(model_dir)['eval_examples'] == 2


@pytest.mark.slow
@pytest.mark.parametrize('name,depth', [('resnet50_rsb_a1', 50),
                                        ('resnet50_rsb_a2', 10),
                                        ('resnet50_rsb_a3', 10)])
def test_resnet_strikes_back_recipes_train_on_synthetic_data(name, depth,
                                                              tmp_path):
  """Each "ResNet strikes back" recipe as written (LAMB, BCE, mixup/CutMix,
  drop path, its schedule), shortened to one epoch of two steps of 2 images
  at 64 px: it loads, trains on mixed targets and evaluates the softmax.
  A1 trains its ResNet-50; A2 and A3, whose flags differ from A1's only in
  values, a ResNet-10 (a ResNet-50's graph takes half a minute to build)."""
  model_dir = str(tmp_path / 'run')
  result = runner.run_main([
      '--config', name, '-synth', '-md', model_dir, '-bs', '2', '-te', '1',
      '--train_steps', '2', '--steps_per_loop', '2', '--log_steps', '1',
      '--image_size', '64', '--eval_image_size', '64', '-ebe', '1',
      '--num_eval_examples', '2', '--num_classes', '10', '--dtype', 'fp32',
      '--resnet_depth', str(depth), '--noenable_checkpoint_and_export'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'accuracy on mixed targets' in result.stderr
  summary = runner.read_summary(model_dir)
  assert summary['optimizer'] == 'LAMB' and summary['train_targets'] == 'mixed'
  assert summary['train_steps'] == 2 and summary['eval_examples'] == 2
  with open(os.path.join(model_dir, 'config.json')) as f:
    effective = json.load(f)['config']
  assert (effective['loss'], effective['lr_schedule'],
          effective['cutmix_alpha']) == ('bce', 'cosine', 1.0)


def test_the_quick_start_takes_its_fp32_settings_in_fp32():
  """fashion_mnist_fast's fp32 block: what a run in fp32 (--dtype fp32, or
  auto on a CPU without bf16 hardware) trains, said in one line; the
  command line still wins over it."""
  printed = lambda result: yaml.safe_load(result.stdout)
  fp32 = runner.run_main(['--config', 'fashion_mnist_fast', '--dtype=fp32',
                          '--train_epochs=5', '--print_config'])
  assert fp32.returncode == 0, fp32.stderr
  assert (printed(fp32)['stage_widths'], printed(fp32)['train_epochs'],
          printed(fp32)['epochs_between_evals']) == ('24,48,96,128', 5, 4)
  assert ('recipe fashion_mnist_fast in fp32 (--dtype=fp32): '
          '--stage_widths=24,48,96,128, --epochs_between_evals=4') in fp32.stderr
  bf16 = runner.run_main(['--config', 'fashion_mnist_fast', '--dtype=bf16',
                          '--print_config'])
  assert (printed(bf16)['stage_widths'],
          printed(bf16)['train_epochs']) == ('32,64,128,128', 3)
  assert 'in fp32' not in bf16.stderr
