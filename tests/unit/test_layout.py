"""The repository's sizes and the package's layout (issue 81): no
definition over 150 lines and no module over 600, anywhere it keeps Python
(testbed/ and benchmarks/ too). Past those a function, class or module holds
more than one concern: cut it by concern, not at a line count. A package
whose docstring lists its modules lists them all, and only modules that
exist. resnet_keras/ is its folders, one concern each, each importing only
the folders below it; beside them stand only the tools' command lines and
the ground they all write through."""

import ast
import pathlib
import re
import subprocess
import tomllib

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
_LISTING_PACKAGES = ('common', 'resnet_keras/config', 'resnet_keras/data',
                     'resnet_keras/model', 'resnet_keras/optimization',
                     'resnet_keras/rundir', 'resnet_keras/engine',
                     'resnet_keras/serving', 'resnet_keras/training',
                     'resnet_keras/tools', 'resnet_keras/launcher', 'testbed',
                     'testbed/soak')


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


# resnet_keras/'s folders from the ground up (the README's map): each
# imports only folders before it here. files.py is the ground (config/
# writes through it); the tools' command lines stand above them all.
PACKAGE = REPO / 'resnet_keras'
FLOORS = ('files.py', 'config', 'data', 'optimization', 'model', 'rundir',
          'engine', 'serving', 'training', 'tools', 'launcher')


def _command_lines() -> set:
  """The package's modules users run: `python -m resnet_keras.<tool>`, the
  console scripts of pyproject.toml."""
  scripts = tomllib.loads((REPO / 'pyproject.toml').read_text())
  targets = [target.split(':')[0]
             for target in scripts['project']['scripts'].values()]
  return {target.split('.')[1] + '.py' for target in targets
          if target.count('.') == 1 and target.startswith('resnet_keras.')}


def test_the_package_is_its_folders_and_its_command_lines():
  """A new module goes in the folder of its concern, never beside them."""
  top = {path.name for path in PACKAGE.glob('*.py')} - {'__init__.py'}
  assert _command_lines() and top - _command_lines() == {'files.py'}
  folders = {path.name for path in PACKAGE.iterdir() if path.is_dir()
             and (path / '__init__.py').exists()}
  assert folders == set(FLOORS) - {'files.py'}
  assert {f'resnet_keras/{folder}' for folder in folders} <= set(
      _LISTING_PACKAGES)


def _imported(path: pathlib.Path) -> set:
  """The first name under resnet_keras of each import of `path`."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] if node.module != 'resnet_keras' else [
          f'resnet_keras.{alias.name}' for alias in node.names]
    elif isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    else:
      continue
    found |= {name.split('.')[1] for name in names
              if name.startswith('resnet_keras.')}
  return found


def _floor(name: str) -> int:
  return FLOORS.index(name + '.py' if name + '.py' in FLOORS else name)


def test_each_folder_imports_only_the_folders_below_it():
  upward = []
  for path in sorted(PACKAGE.rglob('*.py')):
    inside = path.relative_to(PACKAGE).parts
    if len(inside) == 1 and inside[0] not in FLOORS:
      continue  # A command line: above every floor.
    here = _floor(inside[0].removesuffix('.py'))
    upward += [f'{path.relative_to(REPO)} -> {name}'
               for name in sorted(_imported(path))
               if name in {floor.removesuffix('.py') for floor in FLOORS}
               and _floor(name) > here]
  assert upward == []
