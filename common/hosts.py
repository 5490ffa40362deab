"""Host names as a job meets them, read alike by the launcher and the
trainer: a host name or address checked before it reaches ssh, mpirun or
srun as an argument; this host's address on the route to another.
"""

import ipaddress
import re
import socket

from common.errors import UsageError

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
