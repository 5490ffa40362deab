"""Files written whole or not at all: a reader (another tool, a resumed run,
a glob for shards) never sees one half-written, whatever stops the writer."""

import json
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Tuple

from common.errors import UsageError


def temporary_path(path: str) -> str:
  """Where `path` is written before it is renamed into place: beside it and
  hidden, so readers that glob 'train-*' never see a partial file."""
  directory, name = os.path.split(path)
  return os.path.join(directory, f'.{name}.tmp')


def write_bytes_atomically(path: str, content: bytes) -> None:
  """Writes `content` to a temporary file beside `path`, flushed to disk,
  then renames it over `path` (atomic on POSIX file systems)."""
  tmp = temporary_path(path)
  with open(tmp, 'wb') as f:
    f.write(content)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_text_atomically(path: str, text: str) -> None:
  write_bytes_atomically(path, text.encode())


def write_json_atomically(path: str, content: Dict) -> None:
  write_text_atomically(path, json.dumps(content, indent=2, sort_keys=True) +
                        '\n')


def read_records(path: str, readable: Callable[[Any], bool]
                 ) -> Tuple[List, Optional[str]]:
  """The records of the JSON list at `path` that `readable` accepts ([]
  without the file), and why any were left out: the file cut short, not
  JSON, not a list, or records of another shape (None: none left out).
  For a run's record files, which a user, a full disk or a crash may have
  damaged: the caller decides whether that stops it."""
  try:
    with open(path) as f:
      records = json.load(f)
  except FileNotFoundError:
    return [], None
  except (OSError, ValueError) as e:
    return [], str(e) or type(e).__name__
  if not isinstance(records, list):
    return [], 'not a JSON list'
  kept = [r for r in records if readable(r)]
  if len(kept) < len(records):
    return kept, (f'{len(records) - len(kept)} of its {len(records)} records '
                  'are not of the shape it holds')
  return kept, None


_KINDS = ((stat.S_ISDIR, 'is a directory'), (stat.S_ISREG, 'is a file'),
          (stat.S_ISFIFO, 'is a FIFO (named pipe)'),
          (stat.S_ISSOCK, 'is a socket'), (stat.S_ISCHR, 'is a device'),
          (stat.S_ISBLK, 'is a device'))


def kind_of(path: str) -> str:
  """What `path` is, as a message says it when it is not what was asked
  for: 'does not exist', 'is a directory', 'is a file', 'is a FIFO (named
  pipe)', ... (symbolic links followed)."""
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    return 'does not exist'
  except OSError as e:
    return f'cannot be read ({e.strerror})'
  return next(kind for test, kind in _KINDS if test(mode))


def check_path_length(flag: str, path: str, room: int) -> None:
  """Refuses, in one line, a directory `path` (given as `flag`) whose name
  or one of whose folders' names is longer than its file system allows
  (NAME_MAX), or that leaves less than `room` characters (what a program
  writes inside it) below PATH_MAX: before any work, not after it, when
  the first write inside fails."""
  absolute = os.path.abspath(path)
  existing = absolute
  while not os.path.exists(existing) and existing != os.path.dirname(existing):
    existing = os.path.dirname(existing)
  name_max, path_max = (_pathconf(existing, 'PC_NAME_MAX', 255),
                        _pathconf(existing, 'PC_PATH_MAX', 4096))
  shown = path if len(path) <= 60 else f'{path[:40]}...{path[-12:]}'
  for name in absolute.split(os.sep):
    if len(name.encode()) > name_max:
      raise UsageError(
          f'{flag}={shown} has a folder name of {len(name.encode())} bytes '
          f'({name[:20]}...), over the file system\'s limit of {name_max} '
          f'(NAME_MAX); choose a shorter {flag}')
  if len(absolute.encode()) + room > path_max:
    raise UsageError(
        f'{flag}={shown} is {len(absolute.encode())} bytes long as an '
        f'absolute path; what is written inside it takes up to {room} more, '
        f'over the system\'s limit of {path_max} (PATH_MAX): choose a '
        f'{flag} of at most {path_max - room} bytes')


def _pathconf(path: str, name: str, default: int) -> int:
  try:
    return os.pathconf(path, name)
  except (OSError, ValueError):
    return default
