"""Named configurations: YAML recipes that fill in flag values.

A recipe is a flat YAML mapping from flag names (long names, as in
`--helpfull`) to values, plus an optional `description` and an optional
`fp32` block of settings for runs that train in fp32 (`for_dtype`; the
entry points decide the dtype before TensorFlow loads, flags.apply_config). `--config NAME`
reads `resnet_keras/configs/NAME.yaml` (installed with the package); `--config PATH` reads any
file. Precedence: the command line, then the recipe, then the flag defaults.
The launcher's optimizer presets are applied the same way, after the recipe,
so a recipe's value is never replaced by a preset.
"""

import dataclasses
import os
from typing import Any, Collection, Dict, List

import yaml

from resnet_keras.config import RunConfig
from common.errors import UsageError

RECIPES_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
# Under this key a recipe may hold settings for runs that train in fp32
# (--dtype fp32, or auto on a machine without bf16 or fp16 hardware), over
# its own: a model shape fp32 kernels run faster, say (fashion_mnist_fast).
FP32_KEY = 'fp32'
META_KEYS = ('description', FP32_KEY)
# absl flag type -> the YAML types a value may have (int for float: YAML
# writes 40.0 as 40).
_YAML_TYPES = {'bool': (bool,), 'int': (int,), 'float': (int, float),
               'string': (str,), 'comma-separated floats': (str, list),
               'comma-separated integers': (str, list)}


def available() -> List[str]:
  return sorted(name[:-len('.yaml')] for name in os.listdir(RECIPES_DIR)
                if name.endswith('.yaml'))


def resolve(name_or_path: str) -> str:
  """resnet_keras/configs/NAME.yaml for a name, else the path as given."""
  if os.path.isfile(name_or_path):
    return name_or_path
  path = os.path.join(RECIPES_DIR, f'{name_or_path}.yaml')
  if os.sep not in name_or_path and os.path.isfile(path):
    return path
  raise UsageError(f'--config={name_or_path} is neither a file nor a recipe '
                   f'in resnet_keras/configs/; recipes: {", ".join(available())}')


def load(path: str) -> Dict[str, Any]:
  try:
    with open(path) as f:
      recipe = yaml.safe_load(f)
  except (OSError, yaml.YAMLError) as e:
    reason = getattr(e, 'strerror', None) or str(e).splitlines()[0]
    raise UsageError(f'--config={path} cannot be read as YAML ({reason})'
                     ) from None
  if recipe is None:
    return {}
  if not isinstance(recipe, dict):
    raise UsageError(f'--config={path} must be a mapping of flag names to '
                     f'values, not a {type(recipe).__name__}')
  return recipe


def for_dtype(recipe: Dict[str, Any], dtype: str) -> Dict[str, Any]:
  """The recipe's settings for a run in `dtype`: for fp32, its FP32_KEY
  block over the rest."""
  settings = {k: v for k, v in recipe.items() if k not in META_KEYS}
  block = recipe.get(FP32_KEY) or {}
  if not isinstance(block, dict):
    raise UsageError(f'{FP32_KEY} in a recipe must be a mapping of flag '
                     f'names to values, not a {type(block).__name__}')
  return {**settings, **block} if dtype == 'fp32' else settings


def _check_type(source: str, key: str, value: Any, flag) -> None:
  if value is None and flag.default is None:
    return
  allowed = _YAML_TYPES[flag.flag_type()]
  # bool is an int in Python; an int flag must not take `true`.
  if isinstance(value, bool) != (bool in allowed) or not isinstance(
      value, allowed):
    raise UsageError(f'{source}: {key} must be a {flag.flag_type()}, got '
                     f'{value!r} ({type(value).__name__})')


def apply(values, settings: Dict[str, Any], source: str,
          allowed: Collection[str], skip: Collection[str] = (),
          launcher_keys: Collection[str] = ()) -> Dict[str, Any]:
  """Sets each flag in `settings` that the command line did not give.

  `values` are parsed absl FlagValues; keys outside `allowed` are an error
  (`launcher_keys` get a hint to use the launcher); keys in `skip` were
  already filled from a higher-precedence source. Returns the settings
  applied, as written in `settings`.
  """
  applied = {}
  for key, value in settings.items():
    if key in META_KEYS:
      continue
    if key not in allowed:
      hint = ('a launcher setting: run this recipe with demo_resnet_keras.py'
              if key in launcher_keys else 'not a setting; see --helpfull')
      raise UsageError(f'{source}: unknown key "{key}" ({hint})')
    flag = values[key]
    _check_type(source, key, value, flag)
    if flag.present or key in skip:
      continue
    # The flag's parser: ints become floats, lists tuples, as typed flags do.
    flag.value = None if value is None else flag.parser.parse(value)
    applied[key] = value
  return applied


def as_args(settings: Dict[str, Any]) -> List[str]:
  """Command-line arguments that set `settings` (None: the default)."""
  args = []
  for name, value in settings.items():
    if value is None:
      continue
    if isinstance(value, bool):
      args.append(f'--{name}' if value else f'--no{name}')
    elif isinstance(value, (list, tuple)):
      args.append(f'--{name}={",".join(map(str, value))}')
    else:
      args.append(f'--{name}={value}')
  return args


def dump(cfg: RunConfig, extra: Dict[str, Any] = None) -> str:
  """The effective configuration as a recipe `--config` reads back."""
  values = dict(extra or {})
  values.update(dataclasses.asdict(cfg))
  # Tuples (profile_steps, lr_decay_points) as their flags' text.
  values.update({k: ','.join(map(str, v)) for k, v in values.items()
                 if isinstance(v, tuple)})
  return yaml.safe_dump(values, sort_keys=False)
