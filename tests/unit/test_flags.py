"""The trainer's flags: the library's defaults, the short aliases, recipes
(--config) and the RunConfig they parse into."""

import dataclasses
import os
import re

import pytest
from absl import flags

from common.errors import UsageError
from resnet_keras.config import flags as flags_lib
from resnet_keras.config import GROUPS, RunConfig
from tests.support.runner import REPO_ROOT


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


def test_the_docs_flag_table_is_the_declarations():
  """docs/training.md's "Flags by concern" is markdown_table()'s output:
  a flag added, renamed or given other choices changes it."""
  with open(os.path.join(REPO_ROOT, 'docs', 'training.md')) as f:
    doc = f.read()
  table = re.search(r'<!-- flags table: .*? -->\n(.*?)\n<!-- end of flags '
                    r'table -->', doc, re.S)
  assert table, 'docs/training.md has no flags table between its markers'
  generated = flags_lib.markdown_table()
  assert table.group(1) == generated, (
      'docs/training.md\'s flags table is stale: replace it with the output '
      'of python -c "from resnet_keras.config import flags; '
      'print(flags.markdown_table())"')
  # One row per group, every option named once, its alias beside it.
  names = re.findall(r'`--(\w+)`', generated)
  assert sorted(names) == sorted(f.name for f in dataclasses.fields(RunConfig))
  assert len(generated.splitlines()) == len(GROUPS) + 2
  assert '`--batch_size` (`-bs`)' in generated
  assert '`--dtype` (`-dt`: fp32, bf16, fp16, auto)' in generated


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
