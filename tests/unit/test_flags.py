"""The trainer's flags: the library's defaults, the short aliases, recipes
(--config) and the RunConfig they parse into."""

import dataclasses

import pytest
from absl import flags

from common.errors import UsageError
from resnet_keras import flags as flags_lib
from resnet_keras.config import RunConfig


def _parsed(*argv) -> flags.FlagValues:
  values = flags.FlagValues()
  flags_lib.define_flags(values)
  values(['prog', *argv])
  return values


def test_no_flags_make_the_default_run_config():
  assert flags_lib.config_from_flags(_parsed()) == RunConfig()


def test_every_run_config_field_is_a_flag():
  values = _parsed()
  for field in dataclasses.fields(RunConfig):
    assert field.name in values, field.name


@pytest.mark.parametrize('short,name,text,value', [
    ('dd', 'data_dir', '/d', '/d'), ('md', 'model_dir', '/m', '/m'),
    ('te', 'train_epochs', '3', 3), ('ebe', 'epochs_between_evals', '2', 2),
    ('bs', 'batch_size', '32', 32), ('dt', 'dtype', 'bf16', 'bf16'),
    ('dlit', 'data_loader_image_type', 'uint8', 'uint8'),
    ('ds', 'distribution_strategy', 'mirrored', 'mirrored')])
def test_short_aliases_set_their_flag(short, name, text, value):
  assert getattr(_parsed(f'-{short}={text}'), name) == value


def test_synth_alias_and_list_and_pair_flags_reach_the_config():
  cfg = flags_lib.config_from_flags(_parsed(
      '-synth', '--lr_decay_points=0.5,0.75', '--profile_steps=2,4'))
  assert cfg.use_synthetic_data
  assert cfg.lr_decay_points == (0.5, 0.75)
  assert cfg.profile_steps == (2, 4)


@pytest.mark.parametrize('argv,fragment', [
    (['--profile_steps=3'], '--profile_steps must be "start,stop"'),
    (['--profile_steps=4,2'], '0 <= start < stop'),
    (['--batch_size=0'], '--batch_size must be > 0, got 0')])
def test_bad_values_are_one_line_usage_errors(argv, fragment):
  with pytest.raises(UsageError, match=fragment):
    flags_lib.config_from_flags(_parsed(*argv))


def test_a_recipe_fills_what_the_command_line_does_not(tmp_path):
  recipe = tmp_path / 'r.yaml'
  recipe.write_text('description: test\nbatch_size: 64\nwarmup_epochs: 2\n')
  values = _parsed(f'--config={recipe}', '-bs=16')
  assert flags_lib.apply_config(values) == {'warmup_epochs': 2}
  cfg = flags_lib.config_from_flags(values)
  assert cfg.batch_size == 16 and cfg.warmup_epochs == 2.0


def test_no_recipe_changes_nothing():
  values = _parsed()
  assert flags_lib.apply_config(values) == {}
  assert flags_lib.config_from_flags(values) == RunConfig()
