"""One writer of a run directory: its lock file, model_dir/run.lock.

A trainer's chief, and each tool writing into a run, holds it while it
writes: an exclusive flock on it (the kernel drops it when the holder ends,
however it ends; Linux's NFS client passes it to the server, so it holds
across hosts) and, in the file, who holds it: program, host, PID, since
when, and the job. A second writer refuses in one line naming the holder.
A lock file nobody holds is a holder that died (killed, its host lost):
the next writer takes the directory over. Two guards against mistaking a
live holder for a dead one where the filesystem's locks do not reach
across hosts (NFS mounted `nolock`, some FUSE filesystems): the holder
renews the file's time every `HEARTBEAT_SECONDS`, and a lock of another
host renewed within `STALE_SECONDS` is live. A job's own attempts are one
writer: the launcher gives every attempt of a job one identity
(worker_contract.job_identity), and an attempt takes over a lock its job's
earlier attempt still holds (a process on a host the job lost, which the
launcher cannot reach to end).

What the holder owns in the directory, and the holding itself (Owner), are
ownership.py's. This module never imports TensorFlow: the launcher asks
it before TensorFlow loads.
"""

import dataclasses
import errno
import fcntl
import json
import os
import socket
import time
from typing import Mapping, Optional, Tuple

from common import worker_contract
from common.errors import UsageError
from resnet_keras.rundir import run_directory

# The holder renews the lock file's time this often, and a lock of another
# host renewed within STALE_SECONDS is taken as live even if the filesystem
# does not show its flock.
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 6 * HEARTBEAT_SECONDS


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds (or held) a run directory."""
  program: str
  host: str
  pid: int
  since: float  # time.time() when it took the directory
  job: Optional[str] = None  # worker_contract.job_identity

  def describe(self) -> str:
    when = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.since))
    return f'{self.program} (pid {self.pid} on {self.host}, since {when})'

  @classmethod
  def read(cls, fd: int) -> Optional['Holder']:
    """The holder a lock file names; None where it names none readable (a
    write cut short, or a file that is not ours)."""
    try:
      text = os.pread(fd, 4096, 0).decode()
      record = json.loads(text)
      return cls(program=str(record['program']), host=str(record['host']),
                 pid=int(record['pid']), since=float(record['since']),
                 job=record.get('job') and str(record['job']))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
      return None


def same_file(fd: int, path: str) -> bool:
  """Whether `path` still names the file open as `fd` (a takeover replaces
  it, a release removes it)."""
  try:
    here, there = os.fstat(fd), os.lstat(path)
  except OSError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _open_lock(path: str, flag: str) -> int:
  try:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW |
                   os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise UsageError(f'{path} is a symbolic link; a run writes none and '
                       'follows none: remove it') from None
    raise UsageError(f'{flag}={os.path.dirname(path)} is not a writable '
                     f'directory ({e.strerror}); choose another {flag}'
                     ) from None


def _try_flock(fd: int) -> bool:
  """Takes the exclusive flock on `fd`: False where another holds it. A
  filesystem without flocks counts as free: the heartbeat then guards."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    return False
  except OSError as e:
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
      return True
    raise


def _write_holder(fd: int, holder: Holder) -> None:
  data = json.dumps(dataclasses.asdict(holder), sort_keys=True).encode()
  os.ftruncate(fd, 0)
  os.pwrite(fd, data + b'\n', 0)
  os.fsync(fd)


def _in_use(flag: str, model_dir: str, holder: Optional[Holder],
            renewed: Optional[float] = None) -> UsageError:
  who = holder.describe() if holder else 'another process'
  since = (f'; its lock was renewed {renewed:.0f} s ago (a holder gone '
           f'with its host frees it {STALE_SECONDS:.0f} s after that)'
           if renewed is not None else '')
  return UsageError(
      f'{flag}={model_dir} is in use by {who}{since}: one writer at a time; '
      'wait for it to end (or stop it), or choose another ' + flag)


def take_lock(model_dir: str, holder: Holder,
               flag: str) -> Tuple[int, Optional[Holder]]:
  """The lock file's descriptor, flocked and naming `holder`, and the
  holder it replaces (one that died, or this job's earlier attempt), if
  any."""
  path = os.path.join(model_dir, run_directory.LOCK_FILE)
  for _ in range(10):
    fd = _open_lock(path, flag)
    try:
      if not _try_flock(fd):
        previous = Holder.read(fd)
        if holder.job and previous and previous.job == holder.job:
          os.close(fd)
          return _replace_lock(path, holder, flag), previous
        raise _in_use(flag, model_dir, previous)
      if not same_file(fd, path):
        os.close(fd)  # Let go or replaced while we waited: look again.
        continue
      previous = Holder.read(fd)
      if previous and not (holder.job and previous.job == holder.job):
        renewed = time.time() - os.fstat(fd).st_mtime
        if _looks_alive(previous, holder, renewed, fd):
          raise _in_use(flag, model_dir, previous, renewed)
      _write_holder(fd, holder)
      return fd, previous
    except BaseException:
      try:
        os.close(fd)
      except OSError:
        pass
      raise
  raise UsageError(f'{flag}={model_dir}: its lock file changed hands ten '
                   'times while this run tried to take it; try again')


def _looks_alive(previous: Holder, holder: Holder, renewed: float,
                 fd: int) -> bool:
  """Whether the holder a free lock file names may yet be alive: where
  flocks do not reach it. Another host's lock renewed within STALE_SECONDS;
  on this host, a live PID where this filesystem ignores flocks."""
  if previous.host != holder.host:
    return renewed < STALE_SECONDS
  return (previous.pid != holder.pid and _is_alive(previous.pid) and
          _flocks_ignored(fd))


def _flocks_ignored(fd: int) -> bool:
  """Whether this filesystem ignores flocks: a second open of our own
  flocked file takes one too."""
  probe = os.open(f'/proc/self/fd/{fd}', os.O_RDONLY | os.O_CLOEXEC)
  try:
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    return False
  except OSError:
    return True
  finally:
    os.close(probe)


def _is_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


def _replace_lock(path: str, holder: Holder, flag: str) -> int:
  """Takes the lock over from this job's earlier attempt, still alive
  somewhere: a new lock file renamed over its (its flock stays on a file
  no path names)."""
  staging = f'{path}.{holder.pid}.tmp'
  fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW |
               os.O_CLOEXEC, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _write_holder(fd, holder)
    os.replace(staging, path)
  except OSError as e:
    os.close(fd)
    raise UsageError(f'{flag}={os.path.dirname(path)}: its lock could not '
                     f'be taken over ({e.strerror})') from None
  return fd

def holder_of(model_dir: str) -> Optional[Holder]:
  """Who holds model_dir now, as far as this host can see without taking
  anything (None: nobody): a flock on its lock file (/proc/locks), or
  another host's lock renewed within STALE_SECONDS."""
  try:
    fd = os.open(os.path.join(model_dir, run_directory.LOCK_FILE),
                 os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError:
    return None
  try:
    holder, info = Holder.read(fd), os.fstat(fd)
  finally:
    os.close(fd)
  if _flocked(info):
    return holder or Holder('another process', 'this host', 0, info.st_mtime)
  if (holder and holder.host != socket.gethostname() and
      time.time() - info.st_mtime < STALE_SECONDS):
    return holder
  return None


def _flocked(info: os.stat_result) -> bool:
  """Whether a flock is held on the file `info` describes (the kernel's
  table: reading it takes none, so it races with no writer)."""
  device = (f'{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:'
            f'{info.st_ino}')
  try:
    with open('/proc/locks') as f:
      rows = [line.split() for line in f]
  except OSError:
    return False
  return any(len(row) > 5 and row[1] == 'FLOCK' and row[5] == device
             for row in rows)


def check_free(model_dir: str, environ: Mapping[str, str]) -> None:
  """Refuses, in one line, a launch into a run directory another job
  holds (the launcher asks before it contacts any host; its trainer's
  chief takes the directory)."""
  holder = holder_of(model_dir)
  job = worker_contract.job_identity(environ)
  if holder and not (job and holder.job == job):
    raise _in_use('--model_dir', model_dir, holder)
