"""The repository's sizes (issue 81): no definition over 150 lines and no
module over 600, anywhere it keeps Python (testbed/ and benchmarks/ too).
Past those a function, class or module holds more than one concern: cut it
by concern, not at a line count. And a package whose docstring lists its
modules lists them all, and only modules that exist."""

import ast
import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_DEFINITION_LINES = 150
MAX_MODULE_LINES = 600
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _python_files() -> list:
  listed = subprocess.run(['git', 'ls-files', '*.py'], cwd=REPO,
                          capture_output=True, text=True, check=True)
  return [REPO / name for name in listed.stdout.split()]


def oversized(source: str, where: str) -> list:
  """'where:line name (N lines)' for each definition of `source` over
  MAX_DEFINITION_LINES, and 'where (N lines)' if the module is over
  MAX_MODULE_LINES."""
  found = []
  lines = len(source.splitlines())
  if lines > MAX_MODULE_LINES:
    found.append(f'{where} ({lines} lines)')
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, _DEFINITIONS):
      length = node.end_lineno - node.lineno + 1
      if length > MAX_DEFINITION_LINES:
        found.append(f'{where}:{node.lineno} {node.name} ({length} lines)')
  return found


def test_no_definition_or_module_is_too_large():
  files = _python_files()
  assert len(files) > 100, 'git listed too few files: the check is off'
  found = []
  for path in files:
    found += oversized(path.read_text(), str(path.relative_to(REPO)))
  assert found == []


def test_an_oversized_definition_and_module_are_found():
  body = '\n'.join(f'  x{i} = {i}' for i in range(MAX_DEFINITION_LINES))
  long_function = f'def grown():\n{body}\n'
  assert oversized(long_function, 'm.py') == [
      f'm.py:1 grown ({MAX_DEFINITION_LINES + 1} lines)']
  nested = 'class Room:\n  ' + long_function.replace('\n', '\n  ')
  assert [line.split()[1] for line in oversized(nested, 'm.py')] == [
      'Room', 'grown']
  module = 'x = 1\n' * (MAX_MODULE_LINES + 1)
  assert oversized(module, 'm.py') == [f'm.py ({MAX_MODULE_LINES + 1} lines)']
  assert oversized(long_function.replace(body, '  pass'), 'm.py') == []


# The packages whose docstring lists their modules.
_LISTING_PACKAGES = ('common', 'resnet_keras/config', 'resnet_keras/launcher',
                     'resnet_keras/serving', 'testbed', 'testbed/soak')


def test_each_package_that_lists_its_modules_lists_them_all():
  for package in _LISTING_PACKAGES:
    folder = REPO / package
    said = ast.get_docstring(ast.parse((folder / '__init__.py').read_text()))
    modules = {path.name for path in folder.glob('*.py')} - {
        '__init__.py', '__main__.py'}
    named = set(re.findall(r'\b(\w+\.py)\b', said))
    assert modules - named == set(), package
    # What it names beside its own: its parent's modules, the entry points.
    assert [name for name in named if not any(
        (where / name).exists() for where in (folder, folder.parent, REPO))
            ] == [], package
