"""pip install of the checkout (pyproject.toml): the packages, the recipes
and the console scripts work outside the checkout, installed or editable.
Processes of their own: pip, and the installed programs."""

import os
import subprocess
import sys

import pytest

from tests.support import runner

# Console scripts beside resnet-keras-train (pyproject.toml).
TOOLS = ('launch', 'preprocess', 'export', 'validate', 'average', 'predict',
         'plots', 'data-service')


def _sources(destination):
  """The checkout's tracked files, copied: pip builds in the tree it gets,
  and the checkout stays clean."""
  names = subprocess.run(['git', 'ls-files', '-z'], cwd=runner.REPO_ROOT,
                         capture_output=True, check=True).stdout
  for name in names.decode().split('\0'):
    if not name or name.startswith('tests/'):
      continue
    target = os.path.join(destination, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(os.path.join(runner.REPO_ROOT, name), 'rb') as f, \
        open(target, 'wb') as g:
      g.write(f.read())
  return destination


def _run(argv, cwd):
  result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout


@pytest.mark.parametrize('editable', [False, True],
                         ids=['installed', 'editable'])
def test_pip_install_gives_packages_recipes_and_console_scripts(tmp_path,
                                                                 editable):
  source = _sources(str(tmp_path / 'source'))
  venv = str(tmp_path / 'venv')
  # The venv sees this Python's packages (TensorFlow, ...): only this
  # project is installed into it, without fetching anything.
  _run([sys.executable, '-m', 'venv', '--system-site-packages', venv],
       str(tmp_path))
  bin_dir = os.path.join(venv, 'bin')
  _run([os.path.join(bin_dir, 'pip'), 'install', '--quiet', '--no-deps',
        '--no-build-isolation', '--disable-pip-version-check'] +
       (['-e'] if editable else []) + [source], str(tmp_path))
  elsewhere = str(tmp_path)  # Neither the checkout nor the source copy.
  where = _run([os.path.join(bin_dir, 'python'), '-c',
                'import common, resnet_keras.serving, resnet_ctl_imagenet_main;'
                'print(resnet_keras.__file__)'], elsewhere)
  assert where.startswith(source if editable else venv), where
  recipe = _run([os.path.join(bin_dir, 'resnet-keras-train'), '--config',
                 'fashion_mnist_fast', '--print_config'], elsewhere)
  assert 'stem_init: pca' in recipe and 'resnet_depth: 10' in recipe
  for tool in TOOLS:
    assert os.access(os.path.join(bin_dir, f'resnet-keras-{tool}'),
                     os.X_OK), tool
  # One tool run through its script (each starts TensorFlow: seconds).
  usage = _run([os.path.join(bin_dir, 'resnet-keras-validate'), '--help'],
               elsewhere)
  assert '--model_dir' in usage and '--saved_model' in usage
  plots = subprocess.run([os.path.join(bin_dir, 'resnet-keras-plots')],
                         cwd=elsewhere, capture_output=True, text=True)
  assert plots.returncode == 2 and 'usage:' in plots.stderr
