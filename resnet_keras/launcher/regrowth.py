"""An elastic job that grows back while it runs. While an attempt runs on
fewer hosts than planned, `Watcher` asks every POLL seconds which of the
hosts it runs without answer the pre-flight check again (`returning`: the
placement's probe of those hosts only, within a short timeout) and may
rejoin now (membership.py: a flapping host's cool-down, the cap of changes
an hour). Once one may, the workers get the warning signal: they save at
the next step boundary and stop (a warning that lands while they start is
held until they can: common/interrupts.py), and the supervisor starts the
next attempt, replanned with the host back (supervisor.py, job.py).
"""

import subprocess
import threading
from typing import Callable, Optional, Sequence

from common.errors import WARNING_SIGNAL
from resnet_keras.launcher import membership
from resnet_keras.launcher import preflight

# Seconds between checks of the dropped hosts.
POLL = 5.0
# The longest a job's end waits for a check in flight (its probe's ssh
# would outlive the launcher otherwise).
CHECK_LIMIT = 30.0


def returning(planned: Sequence[str], running: Sequence[str],
              hosts: membership.Membership,
              check: Callable[[Sequence[str], int], preflight.Report],
              now: float) -> Optional[str]:
  """The line naming the `planned` hosts not `running` that `check` (a
  placement's: hosts, timeout -> its report) finds ready again and that
  may rejoin `now`, or None."""
  dropped = [host for host in planned
             if host not in running and hosts.may_rejoin(host, now)]
  if not dropped:
    return None
  ready = check(dropped, preflight.QUICK_TIMEOUT).ready
  return f'elastic: host(s) {", ".join(ready)} answer again' if ready else None


class Watcher:
  """Asks `ask` (None: no host may rejoin) every POLL seconds while `job`
  (an attempt's process) runs and `may_stop()` holds; once `ask` names a
  host, logs it and sends `job` the warning signal (`stopped_job`)."""

  def __init__(self, ask: Callable[[], Optional[str]], job: subprocess.Popen,
               log: Callable[[str], None], may_stop: Callable[[], bool]):
    self._ask, self._job, self._log, self._may_stop = ask, job, log, may_stop
    self.stopped_job = False
    self._ended = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True)
    self._thread.start()

  def _watch(self) -> None:
    while not self._ended.wait(POLL):
      reason = self._ask()
      if reason is None:
        continue
      if (self._ended.is_set() or self._job.poll() is not None or
          not self._may_stop()):
        return
      self._log(f'{reason}: the workers save at the next step and stop, and '
                'the job restarts with it')
      self.stopped_job = True
      self._job.send_signal(WARNING_SIGNAL)
      return

  def end(self) -> None:
    """The attempt ended: no check after the one in flight, which is not
    waited for (the next attempt would start late)."""
    self._ended.set()

  def join(self) -> None:
    """The job's end: the check in flight done (at most CHECK_LIMIT s)."""
    self._thread.join(CHECK_LIMIT)
