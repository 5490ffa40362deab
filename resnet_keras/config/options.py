"""One declaration per option: its name, type, default, choices or range and
help, written once as a RunConfig field (config/) with `option(...)`.

Everything else is derived from that field: its flag (flags.py: name,
short alias, type, default, help), the check of its value (`check_fields`:
the choices or the range, in one line naming the flag) and its place in
config.json and --print_config (the dataclass's own field order). Rules that
relate several fields are written beside the group that owns them
(config/).
"""

import dataclasses
import re
import typing
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from common.errors import UsageError

_METADATA_KEY = 'option'


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a field declares beyond its name, type and default."""
  help: str
  # The allowed values (None: any of the type). A None value of a field
  # whose default is None is always allowed (not set).
  choices: Optional[Tuple[Any, ...]] = None
  # The allowed range: '> 0', '>= 0', or an interval such as '[0, 1)'.
  within: Optional[str] = None
  # How the range error reads: '--NAME {says} {range}{note}, got VALUE'.
  says: str = 'must be'
  note: str = ''
  alias: Optional[str] = None  # the short flag (-dd for --data_dir)
  # A flag given as text and parsed into the field's value (the flag's
  # type is 'string'); `text` writes the default as the flag's text.
  parse: Optional[Callable[[str], Any]] = None
  text: Optional[Callable[[Any], Optional[str]]] = None
  # A file or directory on this host, as the user gave it: the batch
  # script --dry_run --launcher=slurm prints runs in the checkout, so it
  # gets it absolute.
  path: bool = False
  # Whether a recipe (--config) may set it: every setting of a run may; of
  # the launcher's own options only those that describe the job's shape.
  in_recipe: bool = True
  # absl checks the choices (an enum flag) or the range (an int flag's
  # bounds) as the flag is parsed, with its own message; otherwise
  # `check_fields` does, once the config is built.
  checked_by_flag: bool = False


def option(default: Any, help: str, **spec) -> Any:  # pylint: disable=redefined-builtin
  """A RunConfig field: its default, and the Spec of its flag and check."""
  return dataclasses.field(default=default,
                           metadata={_METADATA_KEY: Spec(help, **spec)})


def spec_of(field: dataclasses.Field) -> Spec:
  return field.metadata[_METADATA_KEY]


def fields_of(cls) -> Sequence[dataclasses.Field]:
  """The option fields `cls` declares itself (a group's own fields)."""
  own = cls.__dict__.get('__annotations__', {})
  return [f for f in dataclasses.fields(cls) if f.name in own]


def field_type(cls, name: str):
  """The declared type of field `name`, Optional[...] unwrapped."""
  hint = typing.get_type_hints(cls)[name]
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is typing.Union and len(args) == 1:
    return args[0]
  return hint


_ONE_SIDED = re.compile(r'^(>=|>|<=|<) *(-?[\d.e+-]+)$')
_INTERVAL = re.compile(r'^([\[(]) *(-?[\d.e+-]+), *(-?[\d.e+-]+) *([\])])$')


def in_range(value: float, within: str) -> bool:
  """Whether `value` lies in `within` ('> 0', '[0, 1)', ...)."""
  one_sided = _ONE_SIDED.match(within)
  if one_sided:
    op, bound = one_sided.group(1), float(one_sided.group(2))
    return {'>': value > bound, '>=': value >= bound, '<': value < bound,
            '<=': value <= bound}[op]
  low_kind, low, high, high_kind = _INTERVAL.match(within).groups()
  low, high = float(low), float(high)
  return ((value >= low if low_kind == '[' else value > low) and
          (value <= high if high_kind == ']' else value < high))


def bounds_of(within: Optional[str]) -> Tuple[Optional[float], Optional[float]]:
  """(lower, upper) of a closed range such as '>= 0' or '[1, 65534]', as
  absl's bounded flags take them (None: unbounded on that side)."""
  if within is None:
    return None, None
  one_sided = _ONE_SIDED.match(within)
  if one_sided:
    op, bound = one_sided.group(1), int(one_sided.group(2))
    if op not in ('>=', '<='):
      raise ValueError(f'a flag\'s bounds are closed, not {within!r}')
    return (bound, None) if op == '>=' else (None, bound)
  low_kind, low, high, high_kind = _INTERVAL.match(within).groups()
  if (low_kind, high_kind) != ('[', ']'):
    raise ValueError(f'a flag\'s bounds are closed, not {within!r}')
  return int(low), int(high)


def range_message(name: str, value: Any, spec: Spec) -> str:
  """'--NAME must be in [0, 1), got 2.0', as the spec words it."""
  where = spec.within if _ONE_SIDED.match(spec.within) else f'in {spec.within}'
  note = f' {spec.note}' if spec.note else ''
  return f'--{name} {spec.says} {where}{note}, got {value}'


def one_of(choices: Sequence[Any], words: Optional[Mapping[Any, str]] = None
           ) -> str:
  """The choices as a help text lists them, 'A, B or C', each followed by
  its `words` in parentheses where it has some: written from the choices,
  a help cannot leave one out or name one that is gone."""
  words = words or {}
  named = [f'{c} ({words[c]})' if c in words else str(c) for c in choices]
  return ' or '.join([', '.join(named[:-1]), named[-1]] if len(named) > 1
                     else named)


def choice_message(name: str, value: Any, choices: Sequence[Any]) -> str:
  allowed = ', '.join(str(c) for c in choices)
  return f'--{name}={value} is not supported; use one of: {allowed}'


# A field's declared type -> the values of that type a JSON record holds
# (an int is a float there: JSON writes 40.0 as 40 from some writers).
_JSON_TYPES = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def check_types(record: Any) -> None:
  """That each field of the dataclass `record` (one rebuilt from JSON, which
  no flag parser checked) holds a value of its declared type; raises
  UsageError naming the first that does not."""
  cls = type(record)
  for field in dataclasses.fields(cls):
    value, kind = getattr(record, field.name), field_type(cls, field.name)
    if value is None and field.default is None:
      continue
    allowed = (tuple,) if typing.get_origin(kind) is tuple else (
        _JSON_TYPES.get(kind))
    # bool is an int in Python; an int field must not take `true`.
    if allowed and (not isinstance(value, allowed) or
                    isinstance(value, bool) != (bool in allowed)):
      name = getattr(kind, '__name__', 'tuple')
      raise UsageError(f'{field.name} must be a {name}, got {value!r}')


def check_fields(cfg: Any, group) -> None:
  """Checks each of `group`'s own fields of `cfg` against its Spec; raises
  UsageError naming the first bad value and what is allowed."""
  for field in fields_of(group):
    spec, value = spec_of(field), getattr(cfg, field.name)
    if value is None and field.default is None:
      continue
    if spec.choices is not None and value not in spec.choices:
      raise UsageError(choice_message(field.name, value, spec.choices))
    if spec.within is not None and not in_range(value, spec.within):
      raise UsageError(range_message(field.name, value, spec))
