"""A test that passes its time limit fails by name, with what it was doing;
a pytest-xdist worker that dies says which test it ran and why.

pytest-timeout decides each test's limit (pytest.ini's `timeout`, a
`timeout` mark); this plugin, through pytest-timeout's own timer hooks,
decides what happens then. Its thread method dumps the stacks on the
worker's terminal and ends the worker: under xdist that output is lost and
the run shows only `node down: Not properly terminated`. Here, when a test
passes its limit:

1. the report is written to a file the xdist controller can read: every
   thread's stack, and each process the test started with its state and
   the last lines of the files it writes (its log, its redirected output);
2. those processes are killed (a test waiting on a hung job returns, and
   nothing is left running);
3. the main thread is interrupted (SIGALRM), so the test fails by name with
   the report as its message and the worker goes on;
4. a main thread that does not come back within `_GRACE` seconds (blocked
   inside TensorFlow's C++) ends the worker; the controller then puts the
   report into the crashed test's failure (`pytest_handlecrashitem`).

A worker that dies without a deadline (the OOM killer, a crash in native
code) gets a report too: faulthandler's stacks, which the worker writes to
a file of its own, and the kernel's line if it names the worker's pid.

The limit is pytest.ini's, scaled by the machine's pace when the budget
plugin measured it (tests/support/budget.py): a machine twice as slow as
the reference gets twice the time, a faster one no less.
"""

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import List, Optional, Set

import psutil
import pytest

# How long the main thread has to come back once interrupted before the
# worker is ended instead (its test is then reported from the controller):
# pytest.ini's timeout_grace, else this.
_GRACE = 30.0
# Lines of each file a test's process writes, and files per process.
_TAIL_LINES = 15
_FILES_PER_PROCESS = 4
_DIR_KEY = 'deadline_dir'
_SCALE_KEY = 'deadline_scale'


def pytest_addoption(parser):
  parser.addini('timeout_grace', f'seconds a test past its limit has to '
                f'come back once interrupted (default {_GRACE:.0f})',
                default=str(_GRACE))


def grace(config) -> float:
  return float(config.getini('timeout_grace'))


def _worker_id() -> str:
  return os.environ.get('PYTEST_XDIST_WORKER', 'main')


def _report_dir(config) -> str:
  return config.stash[_DIR_STASH]


_DIR_STASH = pytest.StashKey[str]()
_OWNS_DIR = pytest.StashKey[bool]()
_NATIVE = pytest.StashKey[object]()


def scale(config) -> float:
  """What every limit is multiplied by on this machine (>= 1)."""
  workerinput = getattr(config, 'workerinput', None)
  if workerinput is not None:
    return float(workerinput.get(_SCALE_KEY, 1.0))
  return float(getattr(config, '_deadline_scale', 1.0))


def set_scale(config, factor: float) -> None:
  """Called by the budget plugin in the controller, before workers start."""
  config._deadline_scale = max(1.0, factor)  # pylint: disable=protected-access


# This process's scale, for the waits tests bound themselves (a job's log
# line, a Slurm job's state): stretched as the test's own limit is.
_SCALE = [1.0]


def stretched(seconds: float) -> float:
  """`seconds` (a bound set on a quiet machine of the reference pace) on
  this machine at its measured pace."""
  return seconds * _SCALE[0]


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
  workerinput = getattr(config, 'workerinput', None)
  if workerinput is not None and _DIR_KEY in workerinput:
    config.stash[_DIR_STASH] = workerinput[_DIR_KEY]
    config.stash[_OWNS_DIR] = False
  else:
    config.stash[_DIR_STASH] = tempfile.mkdtemp(prefix='pytest-deadlines-')
    config.stash[_OWNS_DIR] = True
  if workerinput is not None or not config.getoption('numprocesses', None):
    _write_native_stacks_to_a_file(config)
  _SCALE[0] = scale(config)


def _write_native_stacks_to_a_file(config) -> None:
  """faulthandler's stacks (a segfault, an abort) to a file of this worker's
  own, which the controller reads: its stderr under xdist goes nowhere."""
  path = os.path.join(_report_dir(config), f'{_worker_id()}.native')
  native = open(path, 'w', encoding='utf-8')  # pylint: disable=consider-using-with
  config.stash[_NATIVE] = native
  faulthandler.enable(file=native, all_threads=True)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  native = config.stash.get(_NATIVE, None)
  if native is not None:
    faulthandler.disable()
    native.close()
  if config.stash.get(_OWNS_DIR, False):
    shutil.rmtree(_report_dir(config), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  """The controller gives each xdist worker the report folder and scale."""
  node.workerinput[_DIR_KEY] = _report_dir(node.config)
  node.workerinput[_SCALE_KEY] = scale(node.config)


# --- in the process that runs the test -------------------------------------


class _Deadline:
  """One test's limit: a timer thread that reports, kills and interrupts."""

  def __init__(self, item, seconds: float):
    self.item, self.seconds = item, seconds
    self.report_path = os.path.join(_report_dir(item.config),
                                    f'{_worker_id()}.txt')
    self.started = time.monotonic()
    self.before = _descendants()
    self.passed: Optional[str] = None
    self._raised = False
    self._done = threading.Event()
    self._main = threading.main_thread().ident
    self._previous = signal.signal(signal.SIGALRM, self._interrupted)
    self._timer = threading.Timer(seconds, self._fire)
    self._timer.daemon = True
    self._timer.name = f'deadline {item.nodeid}'
    self._timer.start()

  def cancel(self) -> None:
    self._done.set()
    self._timer.cancel()
    if self._timer is not threading.current_thread():
      self._timer.join()
    signal.signal(signal.SIGALRM, self._previous)
    if os.path.exists(self.report_path):  # Reported in the test's failure.
      os.unlink(self.report_path)

  def _interrupted(self, signum, frame):
    del signum
    # pytest's own failure (a BaseException): a test's `except Exception`
    # does not swallow it, and it is reported without a traceback through
    # whatever line the interrupt landed on. Raised only below a phase's
    # CallInfo.from_call, which makes it the phase's outcome: between
    # phases it would be pytest's internal error; the timer asks again.
    if (self.passed is not None and not self._done.is_set()
        and _inside_a_phase(frame)):
      self._raised = True
      raise pytest.fail.Exception(self.passed, pytrace=False)

  def _fire(self) -> None:
    phase = os.environ.get('PYTEST_CURRENT_TEST', '').rsplit(' ', 1)[-1]
    started = [p for p in _descendants() if p.pid not in self.before]
    report = describe(self.item.nodeid, self.seconds,
                      phase.strip('()') or 'its run', started)
    _write(self.report_path, report)
    self.passed = report
    # The interrupt first, so that it lands in the test's wait rather than
    # after a wait the kill has ended; then the kill, of what is left.
    signal.pthread_kill(self._main, signal.SIGALRM)
    self._done.wait(1.0)
    _kill(started)
    allowed = grace(self.item.config)
    give_up = time.monotonic() + allowed
    while not self._done.wait(1.0):
      if time.monotonic() > give_up:
        break
      if not self._raised:
        signal.pthread_kill(self._main, signal.SIGALRM)
    else:
      return
    _write(self.report_path, report + (
        f'\nThe main thread did not come back within {allowed:.0f} s of the '
        'interrupt (blocked in native code): the worker ended.\n'))
    sys.stderr.flush()
    os._exit(3)  # pylint: disable=protected-access


def _inside_a_phase(frame) -> bool:
  """Whether `frame` runs below a CallInfo.from_call's call of its phase
  (from_call itself as the interrupted frame has returned from it)."""
  frame = frame.f_back if frame is not None else None
  while frame is not None:
    if frame.f_code is _FROM_CALL:
      return True
    frame = frame.f_back
  return False


_FROM_CALL = pytest.CallInfo.from_call.__func__.__code__


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
  item.stash[_DEADLINE] = _Deadline(item, settings.timeout *
                                    scale(item.config))
  _note_test_start(item)
  return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item):
  deadline = item.stash.get(_DEADLINE, None)
  if deadline is not None:
    deadline.cancel()
    del item.stash[_DEADLINE]
  return True


_DEADLINE = pytest.StashKey[_Deadline]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """A test whose limit passed fails even where the interrupt found no phase
  to fail (it landed between phases, and the test then ended): its first
  report after the limit carries the failure."""
  del call
  outcome = yield
  deadline = item.stash.get(_DEADLINE, None)
  if deadline is None or deadline.passed is None or deadline._raised:  # pylint: disable=protected-access
    return
  deadline._raised = True  # pylint: disable=protected-access
  report = outcome.get_result()
  report.outcome = 'failed'
  report.longrepr = deadline.passed


def _note_test_start(item) -> None:
  """Which test this worker (this pid) runs now: what the controller names
  if the worker dies without a report."""
  _write(os.path.join(_report_dir(item.config), f'{_worker_id()}.running'),
         f'{os.getpid()} {item.nodeid}\n')


def _descendants() -> List[psutil.Process]:
  try:
    return psutil.Process().children(recursive=True)
  except psutil.Error:
    return []


def _kill(processes: List[psutil.Process]) -> None:
  for process in processes:
    try:
      process.kill()
    except psutil.Error:
      pass


def _write(path: str, text: str) -> None:
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)


def describe(nodeid: str, seconds: float, phase: str,
             processes: List[psutil.Process]) -> str:
  """The report of a test that passed its limit: every thread's stack and
  the processes it started, with the last lines of what they write."""
  lines = [f'{nodeid} passed its limit of {seconds:.0f} s in {phase}; '
           'its threads and processes then:']
  names = {t.ident: t.name for t in threading.enumerate()}
  here = threading.current_thread().ident
  for ident, frame in sys._current_frames().items():  # pylint: disable=protected-access
    if ident == here:
      continue
    lines.append(f'--- thread {names.get(ident, ident)} ---')
    lines.append(''.join(traceback.format_stack(frame)).rstrip())
  if not processes:
    lines.append('--- no process of its own was running ---')
  for process in processes:
    lines.extend(_describe_process(process))
  return '\n'.join(lines) + '\n'


def _describe_process(process: psutil.Process) -> List[str]:
  try:
    with process.oneshot():
      command = ' '.join(process.cmdline())[:300]
      cpu = process.cpu_times()
      lines = [f'--- process {process.pid} ({process.status()}, '
               f'{cpu.user + cpu.system:.1f} s CPU): {command} ---']
      files = _written_files(process)
  except psutil.Error as e:
    return [f'--- process {process.pid}: gone ({type(e).__name__}) ---']
  for path in files:
    lines.append(f'  last lines of {path}:')
    lines.extend('    ' + line for line in _tail(path))
  return lines


def _written_files(process: psutil.Process) -> List[str]:
  """The text files a process writes: its stdout and stderr where they go to
  files, and files it holds open for writing (a job's log)."""
  found: List[str] = []
  seen: Set[str] = set()
  candidates = []
  for fd in (1, 2):
    try:
      candidates.append(os.readlink(f'/proc/{process.pid}/fd/{fd}'))
    except OSError:
      pass
  candidates += [f.path for f in process.open_files()
                 if getattr(f, 'mode', 'r') in ('w', 'a', 'r+', 'a+')]
  for path in candidates:
    if path in seen or not os.path.isfile(path):
      continue
    seen.add(path)
    found.append(path)
  return found[:_FILES_PER_PROCESS]


def _tail(path: str) -> List[str]:
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - 16384))
      data = f.read()
  except OSError as e:
    return [f'(unreadable: {e})']
  if b'\0' in data:
    return ['(binary)']
  return data.decode('utf-8', 'replace').splitlines()[-_TAIL_LINES:]


# --- in the xdist controller ------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
  """A crashed worker's test: its deadline report, or else why it died as
  far as anything recorded it."""
  del sched
  worker = report.node.gateway.id
  folder = _report_dir(report.node.config)
  text = _read_and_remove(os.path.join(folder, f'{worker}.txt'))
  if not text:
    text = _why_it_died(folder, worker)
  report.longrepr = f'{report.longrepr}\n{text}'


def _why_it_died(folder: str, worker: str) -> str:
  running = _read_and_remove(os.path.join(folder, f'{worker}.running'))
  native = _read_and_remove(os.path.join(folder, f'{worker}.native'))
  pid = running.split(' ', 1)[0] if running else None
  lines = ['It ended without passing its limit (a signal, the OOM killer, '
           'a crash in native code).']
  if native.strip():
    lines += ['faulthandler:', native.rstrip()]
  kernel = _kernel_says(pid) if pid else None
  lines.append(f'The kernel: {kernel}' if kernel else
               f'No kernel message names pid {pid}.')
  memory = psutil.virtual_memory()
  lines.append(f'Memory now: {memory.available / 2**30:.1f} GiB free of '
               f'{memory.total / 2**30:.1f}.')
  return '\n'.join(lines)


def _kernel_says(pid: str) -> Optional[str]:
  try:
    out = subprocess.run(['dmesg'], capture_output=True, text=True,
                         timeout=10, check=False).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  named = [line for line in out.splitlines()
           if f'process {pid} ' in line or f'pid={pid} ' in line]
  return named[-1].strip() if named else None


def _read_and_remove(path: str) -> str:
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      text = f.read()
    os.unlink(path)
    return text
  except OSError:
    return ''


class _Progress:
  """In the xdist controller: a run in which no test has ended for longer
  than any test may take (a worker lost in a way xdist does not see, so it
  waits for a test nobody runs) ends, naming the tests still running,
  instead of waiting for scripts/test.sh's whole-run limit in silence."""

  def __init__(self, limit: float):
    self.limit = limit
    self.running = {}
    self.last = time.monotonic()
    self._stop = threading.Event()
    threading.Thread(target=self._watch, daemon=True,
                     name='suite progress').start()

  def started(self, nodeid: str) -> None:
    self.running[nodeid] = time.monotonic()

  def ended(self, nodeid: str) -> None:
    self.running.pop(nodeid, None)
    self.last = time.monotonic()

  def stop(self) -> None:
    self._stop.set()

  def _watch(self) -> None:
    while not self._stop.wait(10.0):
      quiet = time.monotonic() - self.last
      if quiet > self.limit:
        now = time.monotonic()
        running = '; '.join(f'{n} (for {now - t:.0f} s)'
                            for n, t in self.running.items()) or 'none'
        sys.stderr.write(
            f'\nNo test has ended for {quiet:.0f} s, more than any test may '
            f'take ({self.limit:.0f} s): the run is stuck. Running: '
            f'{running}\n')
        sys.stderr.flush()
        os._exit(3)  # pylint: disable=protected-access


# The controller's watch (logstart and logfinish hooks carry no config).
_CONTROLLER: Optional[_Progress] = None


def pytest_sessionstart(session):
  global _CONTROLLER
  config = session.config
  if hasattr(config, 'workerinput') or not config.getoption('numprocesses',
                                                             None):
    return
  limit = float(config.getini('timeout') or 0)
  if limit:
    # A test's limit, its grace, and a minute for a replaced worker.
    _CONTROLLER = _Progress(limit * scale(config) + 2 * grace(config) + 60)


def pytest_sessionfinish():
  if _CONTROLLER is not None:
    _CONTROLLER.stop()


def pytest_runtest_logstart(nodeid, location):
  del location
  if _CONTROLLER is not None:
    _CONTROLLER.started(nodeid)


def pytest_runtest_logfinish(nodeid, location):
  del location
  if _CONTROLLER is not None:
    _CONTROLLER.ended(nodeid)
