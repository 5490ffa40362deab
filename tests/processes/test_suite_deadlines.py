"""The suite's own guards (tests/support/deadlines.py), on a pytest of their
own with two xdist workers: a test past its limit fails by name with its
threads' stacks and its processes' last lines, and leaves none running; a
worker that dies (blocked in native code past the grace, a segfault) has
its test named with why. A process of its own: the point is a pytest run,
its workers and their deaths."""

import os
import subprocess
import sys
import textwrap

import psutil

from tests.support import runner

_TESTS = '''
import ctypes, signal, subprocess, time

def test_waits_on_a_hung_child(tmp_path):
    log = open(tmp_path / 'child.log', 'w')
    subprocess.Popen('echo the child was here; exec sleep 120', shell=True,
                     stdout=log).wait()

def test_blocked_in_native_code():
    # As a wait inside TensorFlow's C++ that no signal ends: the interrupt
    # stays pending.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(120)

def test_segfaults():
    ctypes.string_at(0)

def test_passes():
    pass
'''


def test_deaths_and_hangs_are_named_with_why(tmp_path):
  (tmp_path / 'test_guarded.py').write_text(_TESTS)
  (tmp_path / 'pytest.ini').write_text(textwrap.dedent('''\
      [pytest]
      timeout = 2
      timeout_grace = 2
      addopts = -p tests.support.deadlines -p no:cacheprovider
      '''))
  environ = {**os.environ, 'PYTHONPATH': runner.REPO_ROOT}
  done = subprocess.run(
      [sys.executable, '-m', 'pytest', '-n', '2', '-p', 'no:benchmark',
       'test_guarded.py'],
      cwd=tmp_path, env=environ, capture_output=True, text=True,
      timeout=300, check=False)
  out = done.stdout
  assert done.returncode == 1, out[-3000:]
  assert '3 failed, 1 passed' in out, out[-3000:]
  hung = _section(out, 'test_waits_on_a_hung_child')
  assert 'passed its limit of 2 s in call' in hung
  assert 'in test_waits_on_a_hung_child' in hung  # The main thread's stack.
  assert 'sleep 120' in hung and 'the child was here' in hung
  native = _section(out, "crashed while running 'test_guarded.py::"
                    "test_blocked_in_native_code'")
  assert 'passed its limit of 2 s in call' in native
  assert 'did not come back within 2 s' in native
  assert 'time.sleep(120)' in native
  segfault = _section(out, "crashed while running 'test_guarded.py::"
                      "test_segfaults'")
  assert 'without passing its limit' in segfault
  assert 'Segmentation fault' in segfault and 'in test_segfaults' in segfault
  assert not [p for p in psutil.process_iter(['cmdline'])
              if p.info['cmdline'] == ['sleep', '120']]


def _section(out: str, marker: str) -> str:
  """The failure section of pytest's output that contains `marker`."""
  sections = out.split('\n____')
  found = [s for s in sections if marker in s]
  assert found, f'{marker!r} not in:\n{out[-3000:]}'
  return found[0]
