"""Commands on many hosts: at most fanout.MAX_SESSIONS at once."""

import threading
import time

from resnet_keras.launcher import fanout


def test_many_hosts_are_asked_a_bounded_number_at_a_time_in_order():
  lock, running, most = threading.Lock(), [0], [0]

  def ask(host):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.002)  # Each ask overlaps the others still running.
    with lock:
      running[0] -= 1
    return host.upper()

  hosts = [f'h{i}' for i in range(3 * fanout.MAX_SESSIONS)]
  assert fanout.each_host(hosts, ask) == [h.upper() for h in hosts]
  assert 1 < most[0] <= fanout.MAX_SESSIONS == 64
  assert fanout.each_host([], ask) == []
