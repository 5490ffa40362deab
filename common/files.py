"""Files written whole or not at all: a reader (another tool, a resumed run,
a glob for shards) never sees one half-written, whatever stops the writer."""

import json
import os
import stat
from typing import Dict


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
