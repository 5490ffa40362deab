"""Every entry point's flags: name, alias target, type, default and bounds.

tests/data/flag_surface.json is this, written by the code before the
launch layer became a library (issue 65) (python -m tests.support.flag_surface, from the
repository's root); tests/unit/test_flag_surface.py compares today's with
it.
"""

import importlib
import importlib.util
import inspect
import json
import os
import re
from unittest import mock

from absl import flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ENTRY_POINTS = ('resnet_ctl_imagenet_main', 'demo_resnet_keras',
                'preprocess_imagenet', 'resnet_keras.export',
                'resnet_keras.validate', 'resnet_keras.average',
                'resnet_keras.predict', 'resnet_keras.data.service')
SCRIPTS = ('scripts/fashion_mnist_to_images.py',)


def surface(define) -> dict:
  """The flags `define` adds: to a FlagValues of its own when it takes one,
  else (preprocess_imagenet) to absl's FLAGS, from which they are removed
  again."""
  if inspect.signature(define).parameters:
    values, before = flags.FlagValues(), set()
    with mock.patch.object(flags, 'FLAGS', values):
      define(values)
  else:
    values = flags.FLAGS
    before = set(values._flags())  # pylint: disable=protected-access
    define()
  rows = {}
  for name, flag in sorted(values._flags().items()):  # pylint: disable=protected-access
    if name in before:
      continue
    default = flag.default
    if name == 'num_workers' and default == os.cpu_count():
      default = 'cpu_count'  # The machine's, not the program's.
    if isinstance(default, tuple):
      default = list(default)
    alias = re.fullmatch(r'Alias for --(\w+)\.', flag.help or '')
    rows[name] = {
        'type': flag.flag_type(), 'default': default,
        'alias_of': alias.group(1) if type(flag).__name__ == '_FlagAlias'
                    else None,
        'short_name': flag.short_name,
        'bounds': [getattr(flag.parser, 'lower_bound', None),
                   getattr(flag.parser, 'upper_bound', None)]}
  for name in set(rows) - before if values is flags.FLAGS else ():
    delattr(values, name)
  return rows


def _script(path: str):
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0],
      os.path.join(REPO_ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def all_surfaces() -> dict:
  out = {name: surface(importlib.import_module(name).define_flags)
         for name in ENTRY_POINTS}
  for path in SCRIPTS:
    out[path] = surface(_script(path).define_flags)
  return out


if __name__ == '__main__':
  from common import env  # pylint: disable=g-import-not-at-top
  env.prepare_tensorflow_environment()
  print(json.dumps(all_surfaces(), indent=1, sort_keys=True, default=str))
