"""Host names as a job meets them, read alike by the launcher and the
trainer: a host name or address checked before it reaches ssh, mpirun or
srun as an argument; a host and a port written and read back as one
address (an IPv6 address in brackets); which hosts of a list are one host;
this host's address on the route to another.
"""

import ipaddress
import re
import socket
from typing import Dict, List, Optional, Sequence, Tuple

from common.errors import UsageError

# A host name as DNS, /etc/hosts and Slurm write them (underscores too):
# never an option (a leading '-') nor anything a shell or ssh reads as
# more than a name.
_HOST_NAME = re.compile(r'[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}')
# The names every resolver gives this host's loopback.
_LOOPBACK_NAMES = frozenset({
    'localhost', 'localhost.localdomain', 'localhost4',
    'localhost4.localdomain4', 'localhost6', 'localhost6.localdomain6',
    'ip6-localhost', 'ip6-loopback'})
_LOOPBACK = (ipaddress.ip_address('127.0.0.1'), ipaddress.ip_address('::1'))
_THIS_HOST = 'this host'
ETC_HOSTS = '/etc/hosts'


def check_host(host: str, source: str) -> str:
  """`host` if it is a host name or an IPv4/IPv6 address; UsageError
  naming `source` (where it was given) otherwise. The hosts reach ssh,
  mpirun's hostfile and srun as arguments (an IPv6 address bare: ssh reads
  no brackets), and are bracketed where a port follows (`host_port`)."""
  if _HOST_NAME.fullmatch(host):
    return host
  if host.startswith('[') and host.endswith(']') and is_ipv6(host[1:-1]):
    raise UsageError(f'{source}: give {host} without brackets, '
                     f'{host[1:-1]}: the brackets are added where a port '
                     'follows')
  try:
    address = ipaddress.ip_address(host)
  except ValueError:
    raise UsageError(f'{source}: {host!r} is not a host name or an IP '
                     'address (letters, digits, ".", "-" and "_", not '
                     'starting with "-"; or an IPv4/IPv6 address)') from None
  if getattr(address, 'scope_id', None):
    # gRPC's addresses and TF_CONFIG have no agreed spelling of a zone.
    raise UsageError(f'{source}: {host!r} is a link-local address with a '
                     'zone; give the host\'s name or a global or unique '
                     'local address')
  return host


def is_ipv6(host: str) -> bool:
  try:
    return ipaddress.ip_address(host).version == 6
  except ValueError:
    return False


def host_port(host: str, port) -> str:
  """HOST:PORT as TF_CONFIG, gRPC and the tf.data service read it: an IPv6
  address in brackets, or its colons would be read as the port's."""
  return f'[{host}]:{port}' if is_ipv6(host) else f'{host}:{port}'


def split_host_port(address: str, source: str) -> Tuple[str, int]:
  """(host, port) of `address`, HOST:PORT or [IPV6]:PORT; UsageError naming
  `source` where it is neither (an IPv6 address without brackets is
  ambiguous: TensorFlow takes its last group for the port and then waits
  for good on an address gRPC cannot read)."""
  host, colon, port = address.rpartition(':')
  if host.startswith('[') and host.endswith(']') and is_ipv6(host[1:-1]):
    host = host[1:-1]
  elif ':' in host:
    bare = address.strip('[]')
    hint = (f'write an IPv6 address in brackets, [{host}]:{port}'
            if is_ipv6(host) else
            f'an IPv6 address needs brackets and a port, [{bare}]:PORT'
            if is_ipv6(bare) else 'give a host and its port, as h1:2410')
    raise UsageError(f'{source}: {address!r} is not HOST:PORT: {hint}')
  if not colon or not host:
    raise UsageError(f'{source}: {address!r} is not HOST:PORT: give a host '
                     'and its port, as h1:2410')
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise UsageError(f'{source}: {address!r}: the port must be a number '
                     'from 1 to 65535')
  return check_host(host, source), int(port)


def read_etc_hosts(path: str = ETC_HOSTS) -> Dict[str, List[str]]:
  """name (lower case) -> its addresses in the hosts file at `path`
  (empty where it cannot be read)."""
  names: Dict[str, List[str]] = {}
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      lines = f.read().splitlines()
  except OSError:
    return names
  for line in lines:
    words = line.split('#', 1)[0].split()
    for name in words[1:]:
      names.setdefault(name.lower().rstrip('.'), []).append(words[0])
  return names


def _address_key(text: str) -> Optional[str]:
  """The address `text` spells (any spelling of it: '::1', '0::1',
  '::ffff:127.0.0.1'), 'this host' for localhost's or an unspecified one;
  None: not an address."""
  try:
    address = ipaddress.ip_address(text)
  except ValueError:
    if not re.fullmatch(r'[0-9.]+|0[xX][0-9a-fA-F]+', text):
      return None
    try:  # What getaddrinfo reads as IPv4 too ('127.1', '2130706433').
      address = ipaddress.ip_address(socket.inet_aton(text))
    except (OSError, ValueError):
      return None
  mapped = getattr(address, 'ipv4_mapped', None)
  address = mapped or address
  # What localhost resolves to, and 0.0.0.0 and :: (a connection to them
  # reaches this host). Other loopback addresses stay apart: tests and
  # benchmarks stand one in for each of many hosts.
  return (_THIS_HOST if address in _LOOPBACK or address.is_unspecified
          else str(address))


def same_host(hosts: Sequence[str],
              etc_hosts: Optional[Dict[str, List[str]]] = None,
              this_name: Optional[str] = None
              ) -> Optional[Tuple[str, str]]:
  """The first two of `hosts` that are one host, or None: the same name
  (in any case), the same address (in any spelling), two names of this
  host (localhost's names and addresses, its own name), or names the hosts
  file gives the same address. Looks nothing up on the network: a name DNS
  alone resolves stands for itself."""
  etc_hosts = read_etc_hosts() if etc_hosts is None else etc_hosts
  this_name = (socket.gethostname() if this_name is None else this_name)
  this_names = {this_name.lower(), this_name.lower().split('.')[0]}
  seen: Dict[str, str] = {}
  for host in hosts:
    name = host.lower().rstrip('.')
    address = _address_key(name)
    if address:
      keys = {address}
    else:
      here = name in _LOOPBACK_NAMES or name in this_names
      keys = {_THIS_HOST if here else 'name ' + name} | {
          _address_key(a) or a for a in etc_hosts.get(name, [])}
    for key in keys:
      if key in seen:
        return seen[key], host
    for key in keys:
      seen[key] = host
  return None


def address_toward(host: str, port: int = 9) -> str:
  """This host's address on the route to `host`, of its address family
  (OSError: no route, or no address)."""
  family, _, _, _, target = socket.getaddrinfo(host, port,
                                               type=socket.SOCK_DGRAM)[0]
  # Connecting a UDP socket only picks the route; it sends nothing.
  with socket.socket(family, socket.SOCK_DGRAM) as probe:
    probe.connect(target)
    return probe.getsockname()[0]
