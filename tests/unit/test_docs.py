"""Every repository file docs/extending.md and the README's architecture map
name exists: a reader follows them to the code; and what they say of the
code (the cluster tests' subnets, the watchdog's backends) holds."""

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


def _ranges(text: str) -> list:
  return sorted((int(low), int(high)) for low, high in
                re.findall(r'(\d+)-(\d+)', text))


def test_extending_names_the_subnets_the_cluster_tests_hold():
  """A new cluster test picks its subnets apart from the others' by the
  ranges extending.md lists: they are the modules' CLUSTER_SUBNETS."""
  text = ' '.join((REPO / 'docs/extending.md').read_text().split())
  listed = re.search(r'`CLUSTER_SUBNETS` range apart from the other '
                     r"modules' \(today ([^)]*)\)", text)
  held = []
  for module in sorted((REPO / 'tests/multihost').glob('test_*.py')):
    subnets = re.search(r'^CLUSTER_SUBNETS = range\((\d+), (\d+)\)',
                        module.read_text(), re.MULTILINE)
    if subnets:
      held.append((int(subnets.group(1)), int(subnets.group(2)) - 1))
  assert held and _ranges(listed.group(1)) == sorted(held)


def test_the_readme_says_the_watchdog_covers_both_backends():
  """The stuck-worker watchdog watches the backend's collectives, whichever
  it is (distribution.Progress, which both backends report to)."""
  text = ' '.join(_architecture_map((REPO / 'README.md').read_text()).split())
  said = re.search(r'`watchdog\.py`: (.*?);', text).group(1)
  assert 'Horovod' in said and 'multi_worker_mirrored' in said
