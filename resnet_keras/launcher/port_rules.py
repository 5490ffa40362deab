"""The port guard's rules as text: the iptables (and ip6tables) commands
that close a job's ports on one host to all but its hosts and loopback, in
a chain of the job's own, and those that remove exactly them, as the shell
commands a host runs. port_guard.py decides where they apply and runs them.

The allowed traffic RETURNs to the host's own rules rather than being
ACCEPTed: the rules only close, never open what a firewall closes.
"""

import dataclasses
import ipaddress
import os
import secrets
import shlex
from typing import List, Optional, Sequence, Tuple

IPV4, IPV6 = 'iptables', 'ip6tables'
_CANNOT = 3  # The script's exit code where the host cannot take rules.


@dataclasses.dataclass(frozen=True)
class Rules:
  """One host's rules: `ports` (inclusive ranges) closed to all but
  `sources` (addresses) and loopback, in the job's own `chain`."""
  chain: str
  sources: Tuple[str, ...]
  ports: Tuple[Tuple[int, int], ...]


def chain_name(token: Optional[str] = None) -> str:
  """A chain named after this launch (its pid and a random token), so that
  removing it removes only its rules; within iptables' 28 characters."""
  return f'RESNET_KERAS_{os.getpid()}_{token or secrets.token_hex(3)}'[:28]


def port_ranges(ports: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
  """`ports` as sorted inclusive ranges of consecutive ports."""
  ranges: List[List[int]] = []
  for port in sorted(set(ports)):
    if ranges and port == ranges[-1][1] + 1:
      ranges[-1][1] = port
    else:
      ranges.append([port, port])
  return tuple((low, high) for low, high in ranges)


def _jumps(rules: Rules, tool: str, action: str) -> List[List[str]]:
  return [[tool, '-w', action, 'INPUT', '-p', 'tcp', '--dport',
           f'{low}:{high}', '-j', rules.chain] for low, high in rules.ports]


def add_commands(rules: Rules, tool: str) -> List[List[str]]:
  """The commands that close `rules.ports` with `tool` (IPV4 or IPV6)."""
  version = 4 if tool == IPV4 else 6
  chain = rules.chain
  commands = [[tool, '-w', '-N', chain],
              [tool, '-w', '-A', chain, '-i', 'lo', '-j', 'RETURN']]
  commands += [[tool, '-w', '-A', chain, '-s', source, '-j', 'RETURN']
               for source in rules.sources
               if ipaddress.ip_address(source).version == version]
  commands.append([tool, '-w', '-A', chain, '-p', 'tcp', '-j', 'REJECT',
                   '--reject-with', 'tcp-reset'])
  return commands + _jumps(rules, tool, '-I')


def remove_commands(rules: Rules, tool: str) -> List[List[str]]:
  """The commands that remove exactly what add_commands added."""
  return _jumps(rules, tool, '-D') + [[tool, '-w', '-F', rules.chain],
                                      [tool, '-w', '-X', rules.chain]]


def remove_script(rules: Rules) -> str:
  """One shell command that removes a host's rules, whatever is left."""
  # Each command on its own: one already gone must not keep the others.
  return ' '.join(f'{shlex.join(c)} 2>/dev/null;' for tool in (IPV4, IPV6)
                  for c in remove_commands(rules, tool)) + ' true'


def add_script(rules: Rules) -> str:
  """One shell command for a host: that it can (root, iptables, and
  ip6tables where the kernel has IPv6, which the servers listen on too),
  the rules, or none and why not."""
  add4, add6 = (' && '.join(shlex.join(c) for c in add_commands(rules, tool))
                for tool in (IPV4, IPV6))
  return (f'[ "$(id -u)" = 0 ] || {{ echo not root; exit {_CANNOT}; }}; '
          f'command -v {IPV4} >/dev/null || '
          f'{{ echo no {IPV4}; exit {_CANNOT}; }}; '
          f'[ ! -e /proc/net/if_inet6 ] || command -v {IPV6} >/dev/null || '
          f'{{ echo no {IPV6}; exit {_CANNOT}; }}; '
          f'{{ {add4} && {{ [ ! -e /proc/net/if_inet6 ] || {{ {add6}; }}; }}; }}'
          f' || {{ {remove_script(rules)}; exit 4; }}')
