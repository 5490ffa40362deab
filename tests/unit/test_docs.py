"""Every repository file docs/extending.md and the README's architecture map
name exists: a reader follows them to the code."""

import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# A file named in code quotes or a link: source, docs, recipes, scripts;
# a data file only with its folder (run directories name theirs bare).
_NAMED = re.compile(r'[`(]([\w./-]+\.(?:py|md|yaml|sh|txt|toml)|'
                    r'[\w.-]+/[\w./-]+\.json)[`)#]')
# Where a bare or partial path is read from: the root, the package (the
# map's names), docs/ (the docs' links).
_ROOTS = ('', 'resnet_keras', 'docs')


def _tracked() -> set:
  listed = subprocess.run(['git', 'ls-files'], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()
  return {pathlib.PurePosixPath(path) for path in listed}


def _architecture_map(readme: str) -> str:
  start = readme.index('## Architecture')
  end = readme.find('\n## ', start + 1)
  return readme[start:end if end >= 0 else None]


def _missing(text: str, tracked: set) -> list:
  names = {name.lstrip('./') for name in _NAMED.findall(text)}
  basenames = {path.name for path in tracked}
  missing = []
  for name in sorted(names):
    if '/' not in name:
      found = name in basenames
    else:
      found = any((REPO / root / name).exists() for root in _ROOTS) or any(
          str(path).endswith('/' + name) for path in tracked)
    if not found:
      missing.append(name)
  return missing


@pytest.mark.parametrize('doc', ['docs/extending.md', 'README.md'])
def test_every_file_a_guide_names_exists(doc):
  text = (REPO / doc).read_text()
  if doc == 'README.md':
    text = _architecture_map(text)
  assert _NAMED.findall(text), f'{doc} names no file: the pattern is off'
  assert _missing(text, _tracked()) == []


def test_a_file_that_does_not_exist_is_found_missing():
  tracked = _tracked()
  assert _missing('`resnet_keras/launcher/pbs.py` and `pbs.py`', tracked) == [
      'pbs.py', 'resnet_keras/launcher/pbs.py']
  assert _missing('`resnet_keras/launcher/slurm.py` and `placement.py`',
                  tracked) == []
