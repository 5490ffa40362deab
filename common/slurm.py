"""Slurm's compressed node lists ('n[1-3,7]'), read alike by the trainer
(common/worker_contract.py: the nodes of its job or step) and the launcher
(resnet_keras/launcher/slurm.py: what scontrol answers). What Slurm's
environment says is the worker contract's; what the launcher asks Slurm is
the Slurm placement's.
"""

import re
from typing import List, Sequence

from common import hosts
from common.errors import UsageError

_BRACKETS = re.compile(r'^([^\[]*)\[([^\]]*)\](.*)$')


def expand_nodelist(nodelist: str) -> List[str]:
  """Slurm's compressed host list ('s[1-3,7]', 'a1,b[01-02]',
  'r[1-2]-n[1-2]') as the node names, in order."""
  nodes = []
  for item in _top_level_items(nodelist):
    match = _BRACKETS.match(item)
    if not match:
      if '[' in item or ']' in item:
        raise _unreadable(nodelist)
      nodes.append(hosts.check_host(item, f'the Slurm node list '
                                          f'{nodelist!r}'))
      continue
    prefix, ranges, rest = match.groups()
    for number in _numbers(ranges, nodelist):
      nodes += expand_nodelist(prefix + number + rest)
  return nodes


_TRAILING_NUMBER = re.compile(r'^(.*?)(\d+)$')


def compress_nodelist(nodes: Sequence[str]) -> str:
  """`nodes` in Slurm's compressed form ('n1,n2,n3,n7' -> 'n[1-3,7]'), in
  their order: expand_nodelist gives them back, each number at its width.
  srun reads it as Slurm writes it; 1,000 names would be ~6 KB."""
  groups = []  # [prefix, [[first, last, width], ...]] per run of a prefix.
  for node in nodes:
    match = _TRAILING_NUMBER.match(node)
    if not match:
      groups.append([node, []])
      continue
    prefix, digits = match.groups()
    number = int(digits)
    if not groups or groups[-1][0] != prefix or not groups[-1][1]:
      groups.append([prefix, [[number, number, len(digits)]]])
      continue
    ranges = groups[-1][1]
    first, last, width = ranges[-1]
    if number == last + 1 and str(number).zfill(width) == digits:
      ranges[-1][1] = number
    else:
      ranges.append([number, number, len(digits)])
  return ','.join(_group(prefix, ranges) for prefix, ranges in groups)


def _group(prefix: str, ranges) -> str:
  """One item of a compressed list: a name, or a prefix and its ranges."""
  spans = [str(first).zfill(width) if first == last else
           f'{str(first).zfill(width)}-{str(last).zfill(width)}'
           for first, last, width in ranges]
  if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
    return prefix + spans[0]
  return f'{prefix}[{",".join(spans)}]' if spans else prefix


def _unreadable(nodelist: str) -> UsageError:
  return UsageError(f'cannot read the Slurm node list {nodelist!r}: '
                    'expected node names and ranges such as n1,n[2-4,7]')


def _top_level_items(nodelist: str) -> List[str]:
  items, depth, start = [], 0, 0
  for i, char in enumerate(nodelist):
    depth += {'[': 1, ']': -1}.get(char, 0)
    if depth not in (0, 1):  # A ']' before its '[', or brackets nested.
      raise _unreadable(nodelist)
    if char == ',' and depth == 0:
      items.append(nodelist[start:i])
      start = i + 1
  if depth:
    raise _unreadable(nodelist)
  items.append(nodelist[start:])
  return [item for item in items if item]


def _numbers(ranges: str, nodelist: str) -> List[str]:
  numbers = []
  for part in ranges.split(','):
    first, dash, last = part.partition('-')
    if not first.isdigit() or (dash and not last.isdigit()):
      raise _unreadable(nodelist)
    # Slurm pads each number to the width of the range's first.
    numbers += [str(n).zfill(len(first))
                for n in range(int(first), int(last or first) + 1)]
  return numbers
