"""Who may write a run directory, and what in it is the run's.

One writer: the holder takes model_dir/run.lock (run_lock.py: who holds
it, and the rules that tell a live holder from a dead one) and keeps it
fresh while it writes (Owner's heartbeat).

What a run owns. model_dir/run_files.txt records every path a run (or a
tool in it) created, one JSON string a line: what appeared while it held the
lock (walked when it takes the lock, every heartbeat and when it lets go)
and, after a holder that died, what appeared from its `since` on.
--clean removes those paths and nothing else: a user's file inside train/,
exports/ or plots/ stays, and so does its folder. A directory without the
record is a run's only if an earlier version's run wrote it (its config.json
reads as a run's): it is adopted, its entries named as a run names them.
Any other non-empty directory is refused, with --clean or without.

Nothing outside. A run writes no symbolic links and follows none: one
anywhere inside the directory is refused before anything is written, and
so is a checkpoint state file naming a path outside the directory (the
checkpoint manager would prune it), and a hard-linked file the run appends
to (metrics.jsonl: the append would change the other name's file too).

This module never imports TensorFlow: the launcher and the tools take the
directory before it loads.
"""

import json
import os
import socket
import threading
import time
from typing import Dict, List, Mapping, Optional, Set, Tuple

from absl import logging

from resnet_keras import files
from common import worker_contract
from common.errors import UsageError
from resnet_keras.rundir import run_directory
from resnet_keras.rundir import run_lock

LOCK_FILE = run_directory.LOCK_FILE
RECORD_FILE = run_directory.RECORD_FILE
# What appeared within this many seconds before a dead holder's `since` is
# still its: file times are set by the file server's clock, which may run a
# little behind the holder's.
_CLOCK_SLACK = 2.0
# Files a run appends to (any other it replaces whole, or creates).
_APPENDED = (run_directory.METRICS_FILE,)
# How many entries a refusal names.
_NAMED = 3


def _describe_entries(names: List[str]) -> str:
  more = f' and {len(names) - _NAMED} more' if len(names) > _NAMED else ''
  return ', '.join(names[:_NAMED]) + more


def _walk(model_dir: str) -> Tuple[Dict[str, float], List[str]]:
  """Every path under model_dir but the lock and the record, relative, a
  folder's ending in '/', with its ctime; and the symbolic links among
  them."""
  found, links = {}, []
  for folder, dirs, names in os.walk(model_dir, onerror=None):
    relative = os.path.relpath(folder, model_dir)
    for name in dirs + names:
      path = os.path.join(folder, name)
      rel = os.path.normpath(os.path.join(relative, name))
      if relative == '.' and name in (LOCK_FILE, RECORD_FILE):
        continue
      try:
        info = os.lstat(path)
      except OSError:
        continue  # Gone since it was listed.
      if os.path.islink(path):
        links.append(rel)
        continue
      is_dir = name in dirs
      found[rel + '/' if is_dir else rel] = info.st_ctime
    dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
  return found, links


def _read_record(path: str) -> Set[str]:
  recorded = set()
  try:
    with open(path, 'rb') as f:
      for line in f:
        try:
          entry = json.loads(line)
        except ValueError:
          continue  # A line cut short by a crash: its path is walked again.
        if isinstance(entry, str):
          recorded.add(entry)
  except FileNotFoundError:
    pass
  except OSError as e:
    raise UsageError(f'{path} cannot be read ({e.strerror}); it records what '
                     'the run wrote: restore its permissions') from None
  return recorded


def _is_legacy_run(model_dir: str) -> bool:
  """Whether an earlier version's run wrote model_dir: its config.json reads
  as a run's record."""
  try:
    with open(os.path.join(model_dir, run_directory.CONFIG_FILE)) as f:
      record = json.load(f)
    return (isinstance(record, dict) and
            isinstance(record.get('config'), dict) and
            'training_plan' in record)
  except (OSError, ValueError):
    return False


def _named_as_a_runs(rel: str) -> bool:
  """Whether a run names an entry so (its top-level name), as the earlier
  versions' runs did."""
  top, _, rest = rel.partition('/')
  return run_directory.is_run_entry(top, is_dir=bool(rest) or
                                    rel.endswith('/'))


def _check_paths_inside(model_dir: str, links: List[str]) -> None:
  """Refuses what would make a run reach outside model_dir."""
  if links:
    first = os.path.join(model_dir, links[0])
    raise UsageError(
        f'{first} is a symbolic link (to {os.readlink(first)}); a run writes '
        'no links and follows none: remove it (or copy what it points at in '
        f'its place){" and " + str(len(links) - 1) + " more" if len(links) > 1 else ""}')
  for name in _APPENDED:
    path = os.path.join(model_dir, name)
    if os.path.isfile(path) and os.stat(path).st_nlink > 1:
      raise UsageError(f'{path} has {os.stat(path).st_nlink} names (hard '
                       'links); the run appends to it, which would change '
                       'the other names\' file too: replace it with a copy')
  outside = run_directory.checkpoints_outside(model_dir)
  if outside:
    raise UsageError(
        f'{os.path.join(model_dir, run_directory.CHECKPOINT_STATE_FILE)} '
        f'names {outside[0]}, outside {model_dir}; a run never writes that '
        'and would prune it: remove that line (or the file)')


def _top(rel: str) -> str:
  """The top-level entry a path lies in ('train/' for 'train/events')."""
  top, slash, _ = rel.partition('/')
  return top + slash


class Owner:
  """A run directory held: its lock, and the record of what the run wrote.
  `release` lets it go (a context manager does on exit)."""

  def __init__(self, model_dir: str, fd: int, recorded: Set[str],
               seen: Set[str]):
    self.model_dir = model_dir
    self._fd = fd
    self._recorded = recorded
    self._seen = seen
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self.created = False  # take() made model_dir itself
    self._grew = False  # this holder recorded what it wrote
    self._heartbeat = threading.Thread(target=self._beat, daemon=True,
                                       name='run_directory_heartbeat')
    self._heartbeat.start()

  def __enter__(self) -> 'Owner':
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  def _record(self, paths) -> None:
    new = sorted(set(paths) - self._recorded)
    if not new:
      return
    with open(os.path.join(self.model_dir, RECORD_FILE), 'a') as f:
      f.write(''.join(json.dumps(p) + '\n' for p in new))
      f.flush()
      os.fsync(f.fileno())
    self._recorded.update(new)
    self._grew = True

  def note_written(self) -> None:
    """Records what appeared since the last look: the run's."""
    with self._lock:
      if self._fd is None:
        return
      found, _ = _walk(self.model_dir)
      new = set(found) - self._seen
      self._seen.update(new)
      self._record(new)

  def _beat(self) -> None:
    while not self._stop.wait(run_lock.HEARTBEAT_SECONDS):
      try:
        os.utime(self._fd)
        self.note_written()
      except (OSError, TypeError):
        pass  # Released meanwhile, or the disk full: the next beat tries.

  def clean(self) -> List[str]:
    """--clean: removes every path the run wrote, and nothing else (a
    folder that holds a user's file stays, with it); refuses, before
    removing anything, a directory whose top level holds what no run
    wrote. Returns the top-level names removed."""
    with self._lock:
      found, _ = _walk(self.model_dir)
      _refuse_foreign(self.model_dir, _foreign(found, self._recorded))
      removed = set()
      ours = [rel for rel in found if rel in self._recorded]
      for rel in sorted((r for r in ours if not r.endswith('/')),
                        reverse=True):
        os.remove(os.path.join(self.model_dir, rel))
        removed.add(_top(rel))
      for rel in sorted((r for r in ours if r.endswith('/')),
                        key=lambda r: -r.count('/')):
        try:
          os.rmdir(os.path.join(self.model_dir, rel))
          removed.add(_top(rel))
        except OSError:
          pass  # Holds what no run wrote: it stays, and so does that.
      self._seen = self._compact()
      return sorted(removed)

  def _compact(self) -> Set[str]:
    """The record rewritten with only what is there (a run's paths it
    removed itself go); returns what is there. Under self._lock."""
    there = set(_walk(self.model_dir)[0])
    self._recorded = {r for r in self._recorded if r in there}
    _write_record(os.path.join(self.model_dir, RECORD_FILE), self._recorded)
    return there

  def release(self) -> None:
    """Records what the run wrote last and lets the directory go. Where
    nothing was written (a run that stopped at bad input), nothing of its
    own is left: no record, and no directory it made."""
    self._stop.set()
    if self._heartbeat is not threading.current_thread():
      self._heartbeat.join()
    if self._fd is None:
      return
    try:
      self.note_written()
      if self._grew:  # A run that wrote nothing leaves the record alone.
        with self._lock:
          self._compact()
    except OSError:
      pass  # A full disk: the next holder records it from our `since`.
    with self._lock:
      path = os.path.join(self.model_dir, LOCK_FILE)
      if run_lock.same_file(self._fd, path):
        try:
          os.remove(path)
        except OSError:
          pass
      os.close(self._fd)
      self._fd = None
      if self._recorded or set(os.listdir(self.model_dir)) != {RECORD_FILE}:
        return
      os.remove(os.path.join(self.model_dir, RECORD_FILE))
      if self.created:
        _remove_if_empty(self.model_dir)


def take(model_dir: str, program: str, environ: Mapping[str, str] = None,
         flag: str = '--model_dir', new_run: bool = True,
         clean: bool = False) -> Owner:
  """Holds model_dir (created if absent) for `program`; refuses in one line
  a directory another writer holds, one that is not a run's (unless empty,
  and `new_run`: a trainer may start a run there, a tool may not; `clean`:
  in --clean's words), and one whose links or files reach outside it."""
  environ = os.environ if environ is None else environ
  created = not os.path.lexists(model_dir)
  try:
    os.makedirs(model_dir, exist_ok=True)
  except OSError as e:
    raise UsageError(f'{flag}={model_dir} is not a writable directory '
                     f'({e.strerror}); choose another {flag}') from None
  if not os.path.isdir(model_dir):
    raise UsageError(f'{flag}={model_dir} is not a directory; choose '
                     f'another {flag}')
  holder = run_lock.Holder(program=program, host=socket.gethostname(),
                           pid=os.getpid(), since=time.time(),
                           job=worker_contract.job_identity(environ))
  fd, previous = run_lock.take_lock(model_dir, holder, flag)
  try:
    owner = _own(model_dir, fd, previous, '--clean' if clean else flag,
                 new_run)
  except BaseException:
    path = os.path.join(model_dir, LOCK_FILE)
    if run_lock.same_file(fd, path) and previous is None:
      os.remove(path)
    os.close(fd)
    if created:
      _remove_if_empty(model_dir)
    raise
  owner.created = created
  return owner


def _remove_if_empty(model_dir: str) -> None:
  try:
    os.rmdir(model_dir)
  except OSError:
    pass  # Something is there after all: it stays.


def _recorded(model_dir: str, found: Dict, flag: str,
              new_run: bool) -> Set[str]:
  """What a run wrote in model_dir, by its record; for a directory an
  earlier version's run wrote, what that run names its entries; refuses
  any other directory but an empty one a new run may start in (--clean's
  refusal where `flag` is '--clean')."""
  record_path = os.path.join(model_dir, RECORD_FILE)
  if os.path.lexists(record_path) and not os.path.isfile(record_path):
    raise UsageError(f'{record_path} is not a file; it records what the run '
                     'wrote: remove it')
  if os.path.exists(record_path):
    return _read_record(record_path)
  if not found and new_run:
    return set()
  if _is_legacy_run(model_dir):
    return {rel for rel in found if _named_as_a_runs(rel)}
  if not found:
    raise UsageError(f'{flag}={model_dir} is empty: no run wrote it')
  if flag == '--clean':
    _refuse_foreign(model_dir, _foreign(found, set()))
  raise UsageError(
      f'{flag}={model_dir} holds what no run wrote '
      f'({_describe_entries(_foreign(found, set()))}) and no {RECORD_FILE}; '
      f'nothing was changed: choose an empty or new {flag}')


def _foreign(found: Dict, recorded: Set[str]) -> List[str]:
  """The top-level entries no run wrote."""
  return sorted(rel for rel in found
                if rel.rstrip('/').count('/') == 0 and rel not in recorded)


def check_cleanable(model_dir: str) -> None:
  """Refuses, in one line, a --clean that the trainer's chief would refuse
  (the launcher asks before it contacts any host); takes nothing."""
  if not os.path.isdir(model_dir):
    return
  found, links = _walk(model_dir)
  _check_paths_inside(model_dir, links)
  _refuse_foreign(model_dir, _foreign(found, _recorded(
      model_dir, found, '--clean', new_run=True)))


def _refuse_foreign(model_dir: str, foreign: List[str]) -> None:
  if foreign:
    raise UsageError(
        f'--clean: --model_dir={model_dir} holds what no run wrote '
        f'({_describe_entries(foreign)}); nothing was removed: choose an '
        'empty or new --model_dir, or move those away yourself')


def _own(model_dir: str, fd: int, previous: Optional[run_lock.Holder],
         flag: str, new_run: bool) -> Owner:
  found, links = _walk(model_dir)
  _check_paths_inside(model_dir, links)
  record_path = os.path.join(model_dir, RECORD_FILE)
  had_record = os.path.exists(record_path)
  recorded = _recorded(model_dir, found, flag, new_run)
  read = set(recorded)
  if found and not had_record:
    logging.debug('%s: a run of an earlier version wrote it; %s now records '
                 'what the run wrote (%d paths)', model_dir, RECORD_FILE,
                 len(recorded))
  if previous:
    # What appeared while a holder that died held it is that run's: its
    # last look did not see it.
    recorded |= {rel for rel, ctime in found.items()
                 if ctime >= previous.since - _CLOCK_SLACK}
    logging.info('%s: taken over from %s, which no longer holds it',
                 model_dir, previous.describe())
  # Only a new record, or one that gained paths, is written: a run refused
  # after this changes nothing on disk. What is gone leaves it in clean().
  if recorded != read or not had_record:
    _write_record(record_path, recorded)
  return Owner(model_dir, fd, recorded, set(found))


def _write_record(path: str, recorded: Set[str]) -> None:
  """The record rewritten whole."""
  files.write_text_atomically(
      path, ''.join(json.dumps(p) + '\n' for p in sorted(recorded)))


def for_training(model_dir: str, clean: bool,
                 environ: Mapping[str, str]) -> Owner:
  """The trainer's chief holds model_dir, and applies --clean: to a job's
  first attempt only; a restarted or requeued one resumes from the
  checkpoints the first wrote."""
  restarts = worker_contract.earlier_attempts(environ)
  owner = take(model_dir, 'resnet_ctl_imagenet_main', environ,
               clean=clean and not restarts)
  try:
    if clean and restarts:
      logging.info('--clean: not applied to restart %d of this job, which '
                   'resumes from the last checkpoint in %s', restarts,
                   model_dir)
    elif clean:
      removed = owner.clean()
      if removed:
        logging.info('--clean: removed what a run wrote in %s: %s',
                     model_dir, ', '.join(removed))
  except BaseException:
    owner.release()
    raise
  return owner


def check_new_or_own(path: str, flag: str, is_own) -> None:
  """Refuses, in one line before any work, a tool's output directory that is
  a file, or a directory holding what the tool did not write there
  (`is_own(path)`: an earlier output of this tool for this run); a new or
  empty one is the tool's."""
  if not os.path.lexists(path):
    return
  if not os.path.isdir(path):
    raise UsageError(f'{flag}={path} {files.kind_of(path)}; a tool writes '
                     'only into a new directory or its own earlier output: '
                     f'choose another {flag}')
  entries = sorted(os.listdir(path))
  if entries and not is_own(path):
    raise UsageError(
        f'{flag}={path} holds what this tool did not write there '
        f'({_describe_entries(entries)}: another run\'s directory?); nothing '
        f'was written: choose a new or empty {flag}')
