"""Recipes (resnet_keras/config/recipes.py) applied to flags: precedence, bad
keys and types, flags spelled from a recipe. (--config through the entry points,
every shipped recipe, the launcher: e2e/.)"""

import pytest
from absl import flags

from resnet_keras.config import recipes
from common.errors import UsageError


def _flag_values(argv=()):
  values = flags.FlagValues()
  flags.DEFINE_integer('batch_size', 256, '', flag_values=values)
  flags.DEFINE_float('warmup_epochs', 5.0, '', flag_values=values)
  flags.DEFINE_boolean('single_l2_loss_op', False, '', flag_values=values)
  flags.DEFINE_string('optimizer', 'SGD', '', flag_values=values)
  flags.DEFINE_integer('global_seed', None, '', flag_values=values)
  values(['prog'] + list(argv))
  return values


ALLOWED = ('batch_size', 'warmup_epochs', 'single_l2_loss_op', 'optimizer',
           'global_seed')


def test_the_command_line_wins_then_the_recipe_then_defaults():
  values = _flag_values(['--batch_size=64'])
  applied = recipes.apply(values, {'description': 'x', 'batch_size': 512,
                                   'warmup_epochs': 3,
                                   'single_l2_loss_op': True}, 'r', ALLOWED)
  assert values.batch_size == 64                      # given: kept
  assert values.warmup_epochs == 3.0 and isinstance(values.warmup_epochs,
                                                    float)
  assert values.single_l2_loss_op is True
  assert values.optimizer == 'SGD'                     # not in the recipe
  assert applied == {'warmup_epochs': 3, 'single_l2_loss_op': True}
  # A later source (a preset) does not replace what the recipe filled in.
  later = recipes.apply(values, {'warmup_epochs': 1, 'optimizer': 'LARS'},
                        'p', ALLOWED, skip=applied)
  assert values.warmup_epochs == 3.0 and values.optimizer == 'LARS'
  assert later == {'optimizer': 'LARS'}


@pytest.mark.parametrize('settings,fragment', [
    ({'bacth_size': 8}, 'unknown key "bacth_size" (not a setting'),
    ({'num_workers_per_hls': 8}, 'a launcher setting'),
    ({'batch_size': 'big'}, 'batch_size must be a int'),
    ({'batch_size': 8.5}, 'batch_size must be a int'),
    ({'batch_size': True}, 'batch_size must be a int'),
    ({'single_l2_loss_op': 1}, 'single_l2_loss_op must be a bool'),
    ({'optimizer': 3}, 'optimizer must be a string'),
    ({'warmup_epochs': None}, 'warmup_epochs must be a float'),
])
def test_bad_keys_and_types_name_the_key(settings, fragment):
  with pytest.raises(UsageError, match=fragment.replace('(', r'\(')):
    recipes.apply(_flag_values(), settings, 'r', ALLOWED,
                  launcher_keys=('num_workers_per_hls',))


def test_none_is_allowed_where_the_default_is_none():
  values = _flag_values()
  recipes.apply(values, {'global_seed': None}, 'r', ALLOWED)
  assert values.global_seed is None


def test_as_args_spells_booleans_and_skips_none():
  assert recipes.as_args({'a': True, 'b': False, 'c': 2.5, 'd': None}) == [
      '--a', '--nob', '--c=2.5']
  assert recipes.as_args({'lr_decay_points': [0.3, 0.6]}) == [
      '--lr_decay_points=0.3,0.6']


def test_the_fp32_block_replaces_settings_only_for_fp32_runs():
  recipe = {'description': 'x', 'batch_size': 256, 'warmup_epochs': 1,
            'fp32': {'batch_size': 192}}
  assert recipes.for_dtype(recipe, 'bf16') == {'batch_size': 256,
                                               'warmup_epochs': 1}
  assert recipes.for_dtype(recipe, 'fp32') == {'batch_size': 192,
                                               'warmup_epochs': 1}
  assert recipes.for_dtype({'batch_size': 8}, 'fp32') == {'batch_size': 8}
  with pytest.raises(UsageError, match='fp32 in a recipe must be a mapping'):
    recipes.for_dtype({'fp32': [1]}, 'fp32')
