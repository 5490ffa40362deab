"""Files written whole or not at all: a reader (another tool, a resumed run)
never sees one half-written, whatever stops the writer."""

import json
import os
from typing import Dict


def write_bytes_atomically(path: str, content: bytes) -> None:
  """Writes `content` to a temporary file beside `path`, then renames it
  over `path` (atomic on POSIX file systems)."""
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    f.write(content)
  os.replace(tmp, path)


def write_text_atomically(path: str, text: str) -> None:
  write_bytes_atomically(path, text.encode())


def write_json_atomically(path: str, content: Dict) -> None:
  write_text_atomically(path, json.dumps(content, indent=2, sort_keys=True) +
                        '\n')
