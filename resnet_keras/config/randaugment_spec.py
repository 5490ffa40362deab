"""--randaugment's grammar (timm's), parsed without TensorFlow so the
config check can use it; data/augment.py applies what it describes."""

import dataclasses
import re
from typing import Optional

MAX_MAGNITUDE = 10.0  # timm's _LEVEL_DENOM and magnitude_max


@dataclasses.dataclass(frozen=True)
class RandAugmentSpec:
  """A parsed --randaugment: how many ops per image, at what magnitude."""
  num_ops: int = 2
  magnitude: float = 9.0
  magnitude_std: float = 0.0  # inf: uniform in [0, magnitude]
  increasing: bool = False  # the 'inc1' op set: severity rises with m
  prob: float = 0.5  # each chosen op is applied with this probability
  trivial: bool = False  # TrivialAugment: 1 op, magnitude uniform [0, 10]


def parse_randaugment(text: str) -> Optional[RandAugmentSpec]:
  """timm's grammar: 'rand' then '-'-separated m<magnitude>, n<ops>,
  mstd<std>, inc<0|1>, p<prob> in any order ('rand-m9-n2-mstd0.5-inc1'),
  or 'trivial'; '' or 'none': off. Raises ValueError naming the bad part."""
  text = (text or '').strip()
  if text in ('', 'none'):
    return None
  if text == 'trivial':
    return RandAugmentSpec(num_ops=1, magnitude=MAX_MAGNITUDE,
                           increasing=True, prob=1.0, trivial=True)
  parts = text.split('-')
  if parts[0] != 'rand':
    raise ValueError(f'"{text}" is neither "trivial" nor "rand-..." (e.g. '
                     'rand-m9-n2-mstd0.5-inc1)')
  values = {}
  for part in parts[1:]:
    match = re.fullmatch(r'(mstd|inc|m|n|p)(inf|\d+(?:\.\d*)?)', part)
    if not match:
      raise ValueError(f'"{part}" in "{text}" is not one of m<magnitude>, '
                       'n<ops>, mstd<std>, inc<0|1>, p<probability>')
    values[match.group(1)] = float(match.group(2))
  spec = RandAugmentSpec(
      num_ops=int(values.get('n', 2)), magnitude=values.get('m', 9.0),
      magnitude_std=values.get('mstd', 0.0),
      increasing=bool(values.get('inc', 0)), prob=values.get('p', 0.5))
  if not 0 <= spec.magnitude <= MAX_MAGNITUDE or spec.num_ops < 1 or not (
      0 < spec.prob <= 1):
    raise ValueError(f'"{text}": the magnitude must be in [0, 10], n >= 1 '
                     'and p in (0, 1]')
  return spec


def format_randaugment(spec: Optional[RandAugmentSpec]) -> str:
  if spec is None:
    return ''
  if spec.trivial:
    return 'trivial'
  return (f'rand-m{spec.magnitude:g}-n{spec.num_ops}-mstd'
          f'{spec.magnitude_std:g}-inc{int(spec.increasing)}-p{spec.prob:g}')
