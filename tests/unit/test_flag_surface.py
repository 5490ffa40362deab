"""Every entry point's flags (names, short aliases, types, defaults, bounds)
are what they were before the launch layer became a library (issue 65):
tests/data/flag_surface.json, written by the code of commit 7c28bad with
tests/support/flag_surface.py, which this test runs on today's code (the
record before it, of commit 555cf07, was a subset of it). Flags added since
are allowed; none recorded may change or go."""

import json
import os

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
