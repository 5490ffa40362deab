"""Command-line flags of resnet_ctl_imagenet_main.py, made from RunConfig.

Every RunConfig field is a flag of the same name, with the default, short
alias and help its `option(...)` declares (config/): the command line and
the library cannot disagree, and a new option is written once. Besides
those, only the recipe flags (--config, --print_config) and flags accepted
for the reference's command lines. The tools define their own few flags.
Entry points' mains pass their parsed FLAGS to `apply_config` and
`config_from_flags`; everything else takes a RunConfig.
"""

import dataclasses
from typing import Any, Collection, Dict

from absl import flags
from absl import logging

from resnet_keras.config import hardware
from resnet_keras.config import options
from resnet_keras.config import recipes
from resnet_keras.config import GROUPS, RunConfig


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines every flag of the trainer in `values` (once)."""
  flags.DEFINE_string('config', None,
                      'A recipe: NAME of resnet_keras/configs/NAME.yaml (e.g. '
                      'resnet50_lars_1worker) or a YAML file of flag: value '
                      'lines. Flags given on the command line override it.',
                      flag_values=values)
  flags.DEFINE_boolean('print_config', False,
                       'Print the effective configuration (flags, recipe and '
                       'defaults merged) as YAML and exit.',
                       flag_values=values)
  define_options(values, GROUPS)
  flags.DEFINE_boolean('use_keras_mixed_precision', False,
                       'Accepted for compatibility with the reference\'s '
                       'command lines: the Keras mixed-precision policy is '
                       'the only bf16/fp16 path here.',
                       flag_values=values)


def define_options(values: flags.FlagValues, groups) -> None:
  """The flag of every option the config `groups` declare (option(...))."""
  for group in groups:
    for field in options.fields_of(group):
      _define_option(values, group, field)


def _define_option(values: flags.FlagValues, group,
                   field: dataclasses.Field) -> None:
  """The flag of one RunConfig field, as its Spec declares it."""
  spec, name, default = options.spec_of(field), field.name, field.default
  kind = options.field_type(group, name)
  if spec.parse is not None:  # Given as text, parsed by RunConfig's rules.
    flags.DEFINE_string(name, spec.text(default), spec.help,
                        flag_values=values)
  elif spec.checked_by_flag and spec.choices:
    flags.DEFINE_enum(name, default, spec.choices, spec.help,
                      flag_values=values)
  elif kind is bool:
    flags.DEFINE_boolean(name, default, spec.help, flag_values=values)
  elif kind is int:
    lower, upper = (options.bounds_of(spec.within) if spec.checked_by_flag
                    else (None, None))
    flags.DEFINE_integer(name, default, spec.help, flag_values=values,
                         lower_bound=lower, upper_bound=upper)
  elif kind is float:
    flags.DEFINE_float(name, default, spec.help, flag_values=values)
  elif kind is str:
    flags.DEFINE_string(name, default, spec.help, flag_values=values)
  elif str in kind.__args__:  # A tuple of names, comma-separated.
    flags.DEFINE_list(name, list(default), spec.help, flag_values=values)
  else:  # A tuple of numbers, written as comma-separated values.
    number = int if int in kind.__args__ else float
    flags.DEFINE(_NumberListParser(number), name, default, spec.help,
                 serializer=flags.CsvListSerializer(','), flag_values=values)
  if spec.alias:
    flags.DEFINE_alias(spec.alias, name, flag_values=values)


class _NumberListParser(flags.ListParser):
  """Comma-separated numbers of one type, as a tuple (RunConfig holds no
  lists)."""

  def __init__(self, kind=float):
    super().__init__()
    self.kind = kind
    self.kind_name = 'integers' if kind is int else 'floats'

  def parse(self, argument):
    if isinstance(argument, (tuple, list)):
      return tuple(argument)
    try:
      return tuple(self.kind(p) for p in super().parse(argument))
    except ValueError:
      raise ValueError(f'expected comma-separated {self.kind_name}, got '
                       f'"{argument}"') from None

  def flag_type(self):
    return f'comma-separated {self.kind_name}'


def markdown_table() -> str:
  """The flags of each config group as a Markdown table, with their short
  aliases and choices: docs/training.md's "Flags by concern", written from
  the same declarations as the flags (a unit test keeps them equal)."""
  rows = ['| group | flags |', '|---|---|']
  for group in GROUPS:
    items = []
    for field in options.fields_of(group):
      spec = options.spec_of(field)
      notes = ([f'`-{spec.alias}`'] if spec.alias else []) + (
          [', '.join(str(c) for c in spec.choices)] if spec.choices else [])
      items.append(f'`--{field.name}`' +
                   (f' ({": ".join(notes)})' if notes else ''))
    rows.append(f'| `{group.__name__}` | {", ".join(items)} |')
  return '\n'.join(rows)


RUN_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))
# The flags (names and short aliases) whose value is a file or directory on
# this host.
PATH_FLAGS = frozenset(
    name for f in dataclasses.fields(RunConfig) if options.spec_of(f).path
    for name in (f.name, options.spec_of(f).alias) if name)


def apply_config(values: flags.FlagValues,
                 allowed: Collection[str] = RUN_CONFIG_KEYS,
                 launcher_keys: Collection[str] = ()) -> Dict[str, Any]:
  """Fills the flags --config's recipe sets and the command line does not;
  returns those settings. `values`: the entry point's parsed flags.
  """
  if not values.config:
    return {}
  path = recipes.resolve(values.config)
  source = f'--config={path}'
  recipe = recipes.load(path)
  if recipe.get(recipes.FP32_KEY):
    flag = values['dtype']
    dtype, why = hardware.dtype_here(
        flag.value if flag.present else recipe.get('dtype', flag.default))
    if dtype == 'fp32':
      logging.info('recipe %s in fp32 (%s): %s', values.config, why,
                   ', '.join(recipes.as_args({
                       k: v for k, v in recipe[recipes.FP32_KEY].items()
                       if k in values and not values[k].present})))
    recipe = recipes.for_dtype(recipe, dtype)
  return recipes.apply(values, recipe, source, allowed,
                       launcher_keys=launcher_keys)


def config_from_flags(values: flags.FlagValues) -> RunConfig:
  """Builds (and checks) the RunConfig from parsed flags (`values`, as in
  apply_config)."""
  kwargs = {}
  for field in dataclasses.fields(RunConfig):
    if field.name in values:
      parse = options.spec_of(field).parse
      value = values[field.name].value
      kwargs[field.name] = parse(value) if parse else value
  if values.use_keras_mixed_precision:
    logging.info('--use_keras_mixed_precision: the Keras mixed-precision '
                 'policy is always used here; nothing to switch')
  cfg = RunConfig(**kwargs)
  cfg.check()
  return cfg
