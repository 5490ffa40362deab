"""When a host an elastic job dropped may rejoin it: after a cool-down that
doubles each time the host is dropped again (a host that flaps stays out
longer), and only while the job's membership changed fewer than its cap of
times in the last hour (each change restarts the workers). Pure: the
clock is the caller's (seconds, monotonic).

A host's first drop has no cool-down: it is not yet flapping, and one that
answers again is taken back at once. Its n-th drop (n >= 2) keeps it out
FIRST_COOLDOWN x 2^(n-2) seconds, at most MAX_COOLDOWN, as Horovod
Elastic's blacklist cool-down (10 s, growing to 100 s).
"""

import collections
from typing import Deque, Dict, Sequence

FIRST_COOLDOWN = 10.0
MAX_COOLDOWN = 100.0
HOUR = 3600.0


def cooldown(drops: int) -> float:
  """Seconds a host dropped `drops` times stays out after its last drop."""
  if drops < 2:
    return 0.0
  return min(FIRST_COOLDOWN * 2 ** (drops - 2), MAX_COOLDOWN)


class Membership:
  """The job's hosts' drops and the times its membership changed."""

  def __init__(self, max_changes_per_hour: int):
    self.cap = max_changes_per_hour
    self._drops: Dict[str, int] = collections.Counter()
    self._dropped_at: Dict[str, float] = {}
    self._changes: Deque[float] = collections.deque()

  def changed(self, before: Sequence[str], after: Sequence[str],
              now: float) -> None:
    """The job's hosts went from `before` to `after` (one change, if any
    host left or came)."""
    for host in before:
      if host not in after:
        self._drops[host] += 1
        self._dropped_at[host] = now
    if set(before) != set(after):
      self._changes.append(now)

  def changes_in_last_hour(self, now: float) -> int:
    while self._changes and self._changes[0] <= now - HOUR:
      self._changes.popleft()
    return len(self._changes)

  def may_rejoin(self, host: str, now: float) -> bool:
    """Whether `host`, dropped, may be taken back now: its cool-down is
    over and the hour's changes are under the cap."""
    if self.changes_in_last_hour(now) >= self.cap:
      return False
    since = now - self._dropped_at.get(host, now)
    return since >= cooldown(self._drops[host])
