"""Loopback ports for servers a test or benchmark starts."""

import socket


def free_ports(n):
  """n distinct loopback ports nothing listens on (bound together, so
  distinct, then released)."""
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
