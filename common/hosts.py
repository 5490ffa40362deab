"""Host names and lists as a job meets them, read alike by the launcher and
the trainer: a host name or address checked before it reaches ssh, mpirun
or srun as an argument; Slurm's compressed node lists ('n[1-3,7]')
expanded; this host's address on the route to another.
"""

import ipaddress
import re
import socket
from typing import List

from common.errors import UsageError

_BRACKETS = re.compile(r'^([^\[]*)\[([^\]]*)\](.*)$')
# A host name as DNS, /etc/hosts and Slurm write them (underscores too):
# never an option (a leading '-') nor anything a shell or ssh reads as
# more than a name.
_HOST_NAME = re.compile(r'[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}')


def check_host(host: str, source: str) -> str:
  """`host` if it is a host name or an IPv4/IPv6 address; UsageError
  naming `source` (where it was given) otherwise. The hosts reach ssh,
  mpirun's hostfile and srun as arguments."""
  if _HOST_NAME.fullmatch(host):
    return host
  try:
    ipaddress.ip_address(host)
    return host
  except ValueError:
    raise UsageError(f'{source}: {host!r} is not a host name or an IP '
                     'address (letters, digits, ".", "-" and "_", not '
                     'starting with "-"; or an IPv4/IPv6 address)') from None


def address_toward(host: str, port: int = 9) -> str:
  """This host's address on the route to `host` (OSError: no route)."""
  # Connecting a UDP socket only picks the route; it sends nothing.
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    probe.connect((host, port))
    return probe.getsockname()[0]


def expand_nodelist(nodelist: str) -> List[str]:
  """Slurm's compressed host list ('s[1-3,7]', 'a1,b[01-02]',
  'r[1-2]-n[1-2]') as the node names, in order."""
  nodes = []
  for item in _top_level_items(nodelist):
    match = _BRACKETS.match(item)
    if not match:
      if '[' in item or ']' in item:
        raise _unreadable(nodelist)
      nodes.append(check_host(item, f'the Slurm node list {nodelist!r}'))
      continue
    prefix, ranges, rest = match.groups()
    for number in _numbers(ranges, nodelist):
      nodes += expand_nodelist(prefix + number + rest)
  return nodes


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
