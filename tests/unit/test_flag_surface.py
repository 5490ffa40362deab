"""Every entry point's flags (names, short aliases, types, defaults, bounds)
are what they were before the launch layer became a library (issue 65):
tests/data/flag_surface.json, written by the code of commit 7c28bad with
tests/support/flag_surface.py, which this test runs on today's code (the
record before it, of commit 555cf07, was a subset of it). Flags added since
are allowed; none recorded may change or go. Issue 71 changed three defaults
on purpose (--model_dir and its alias md, --data_service_work_dir: no shared
/tmp paths), re-taken with tests/support/flag_surface.py for the recorded
flags only."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import flag_surface

RECORDED = os.path.join(flag_surface.REPO_ROOT, 'tests', 'data',
                        'flag_surface.json')


def test_every_flag_name_alias_and_default_is_unchanged():
  with open(RECORDED) as f:
    before = json.load(f)
  # Through JSON, as the record was written (tuples become lists).
  now = json.loads(json.dumps(flag_surface.all_surfaces(), default=str))
  assert sorted(now) == sorted(before)
  for entry_point, flags in before.items():
    kept = {name: now[entry_point].get(name) for name in flags}
    assert kept == flags, entry_point
  assert len(before['resnet_ctl_imagenet_main']) > 100
  assert before['resnet_ctl_imagenet_main']['dd']['alias_of'] == 'data_dir'


# Runs each entry point's --helpfull in turn in one fresh interpreter (as
# `python -m NAME --helpfull` would, one TensorFlow import for all), each
# with only absl's own flags defined; prints each one's help between marks.
_HELP_DRIVER = '''
import runpy, sys
from absl import app, flags
absl_own = set(flags.FLAGS)
for name in sys.argv[1:]:
    for flag in set(flags.FLAGS) - absl_own - {"help", "helpfull",
                                               "helpshort", "helpxml", "?"}:
        delattr(flags.FLAGS, flag)
    sys.argv = [name, "--helpfull"]
    print("=== " + name, flush=True)
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        print("=== exit", e.code, flush=True)
'''


@pytest.mark.slow
def test_every_entry_point_lists_its_flags_in_its_help():
  """--helpfull of a fresh interpreter names every recorded flag and
  alias of each entry point (the console scripts run the same mains)."""
  with open(RECORDED) as f:
    before = json.load(f)
  modules = list(flag_surface.ENTRY_POINTS)
  result = subprocess.run([sys.executable, '-c', _HELP_DRIVER] + modules,
                          cwd=flag_surface.REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
  sections = result.stdout.split('=== ')[1:]
  helps = {}
  for start, end in zip(sections[::2], sections[1::2]):
    name, text = start.split('\n', 1)
    helps[name] = (text, end.split()[1])
  assert sorted(helps) == sorted(modules), result.stderr[-3000:]
  for module in modules:
    text, code = helps[module]
    assert code in ('0', 'None'), (module, code)
    text = text.replace('--[no]', '--')
    missing = [name for name in before[module] if f'--{name}' not in text]
    assert not missing, (module, missing)
