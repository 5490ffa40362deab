"""Every entry point's flags: name, alias target, type and default."""
import importlib
import importlib.util
import inspect
import json
import os
import re
from unittest import mock

from absl import flags

ENTRY_POINTS = {
    'resnet_ctl_imagenet_main': 'resnet_ctl_imagenet_main',
    'demo_resnet_keras': 'demo_resnet_keras',
    'preprocess_imagenet': 'preprocess_imagenet',
    'resnet_keras.export': 'resnet_keras.export',
    'resnet_keras.validate': 'resnet_keras.validate',
    'resnet_keras.average': 'resnet_keras.average',
    'resnet_keras.predict': 'resnet_keras.predict',
    'resnet_keras.data.service': 'resnet_keras.data.service',
}


def surface(define) -> dict:
  """The flags `define` adds: to a FlagValues of its own when it takes one,
  else (preprocess_imagenet) to absl's FLAGS."""
  if inspect.signature(define).parameters:
    values, before = flags.FlagValues(), set()
    with mock.patch.object(flags, 'FLAGS', values):
      define(values)
  else:
    values = flags.FLAGS
    before = set(values._flags())  # pylint: disable=protected-access
    define()
  rows = {}
  own = values._flags()  # pylint: disable=protected-access
  for name, flag in sorted(own.items()):
    if name in before:
      continue
    default = flag.default
    if name == 'num_workers' and default == os.cpu_count():
      default = 'cpu_count'
    if isinstance(default, tuple):
      default = list(default)
    alias = re.fullmatch(r'Alias for --(\w+)\.', flag.help or '')
    alias_of = alias.group(1) if type(flag).__name__ == '_FlagAlias' else None
    rows[name] = {'type': flag.flag_type(), 'default': default,
                  'alias_of': alias_of, 'short_name': flag.short_name,
                  'bounds': [getattr(flag.parser, 'lower_bound', None),
                             getattr(flag.parser, 'upper_bound', None)]}
  return rows


def _script(path):
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def all_surfaces() -> dict:
  out = {}
  for label, module in ENTRY_POINTS.items():
    out[label] = surface(importlib.import_module(module).define_flags)
  out['scripts/fashion_mnist_to_images.py'] = surface(
      _script('scripts/fashion_mnist_to_images.py').define_flags)
  return out


if __name__ == '__main__':
  # From the repository: python -m tests.support.flag_surface
  from common import env
  env.prepare_tensorflow_environment()
  print(json.dumps(all_surfaces(), indent=1, sort_keys=True, default=str))
