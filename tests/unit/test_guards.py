"""The loop guard: a non-finite loss or weight stops a run with one line
naming the step, what was kept and the likely causes; a signal asks for a
stop after the current step. (Whole runs: e2e/ and processes/
test_reliability.py.)"""

import signal

import numpy as np
import pytest
import tensorflow as tf

from common import interrupts
from common.errors import RunStopped
from resnet_keras.engine import guards
from resnet_keras.engine.metrics import LOOP_RECORD, LoopRecord
from resnet_keras.engine.step_record import StepRecord


def test_non_finite_step_finds_the_first_bad_loss():
  assert guards.non_finite_step(np.array([1.0, 2.0]), 11) is None
  assert guards.non_finite_step(np.array([1.0, np.inf, np.nan]), 11) == 12


def _loop(losses, weights_finite=True, stopped_early=False):
  """A loop's output, as the trainer gives it to the guard."""
  return {LOOP_RECORD: LoopRecord(
      first_step=5, losses=np.array(losses), accuracies=np.zeros(len(losses)),
      seconds=1.0, weights_finite=weights_finite,
      stopped_early=stopped_early)}


def _guard():
  return guards.LoopGuard(any_worker=lambda *flags: flags,
                          last_checkpoint=lambda: '/m/ckpt-4', dtype='fp16',
                          stopped_early=lambda: False)


def test_guard_names_the_first_non_finite_loss_checkpoint_and_causes():
  with pytest.raises(RunStopped) as stop:
    _guard()(_loop([1.0, np.nan, np.inf]))
  assert stop.value.exit_code == guards.NON_FINITE_EXIT_CODE
  text = str(stop.value)
  assert 'loss is nan at step 6' in text and '/m/ckpt-4' in text
  assert '--base_learning_rate' in text and 'loss scaling' in text
  assert 'no checkpoint' in guards.non_finite_message('x', None, 'fp32')


def test_guard_stops_on_non_finite_weights_behind_finite_losses():
  _guard()(_loop([1.0, 2.0]))  # All finite: carries on.
  with pytest.raises(RunStopped) as stop:
    _guard()(_loop([1.0, 2.0], weights_finite=False))
  assert stop.value.exit_code == guards.NON_FINITE_EXIT_CODE
  assert 'non-finite after step 6 (the losses were finite)' in str(stop.value)


def test_guard_turns_a_signal_into_a_stop_and_restores_the_handlers():
  guard = _guard()
  before = signal.getsignal(signal.SIGTERM)
  guard.install()
  try:
    assert not guard.stop_requested()
    signal.raise_signal(signal.SIGTERM)
    assert guard.stop_requested()
    with pytest.raises(guards.SignalReceived) as stop:
      guard(_loop([1.0]))
    assert stop.value.exit_code == 143
  finally:
    guard.uninstall()
  assert signal.getsignal(signal.SIGTERM) is before
  assert signal.set_wakeup_fd(-1) == -1  # The wakeup fd is given back.


def test_a_loop_another_worker_stopped_stops_this_one():
  with pytest.raises(guards.SignalReceived) as stop:
    _guard()(_loop([1.0], stopped_early=True))
  assert stop.value.exit_code == 143


def test_a_signal_while_a_function_traces_logs_and_stops(caplog):
  """The signal's warning goes through the guard's log filter while a
  tf.function traces (seen under Horovod: the first loop's end traces the
  weights' check); the filter reads the record's flag only for orbit's
  message, so it never reads a variable in graph mode."""
  record = StepRecord(tf.Variable(0, dtype=tf.int64), max_steps_per_loop=2)
  guard = guards.LoopGuard(any_worker=lambda *flags: flags,
                           last_checkpoint=lambda: None, dtype='fp32',
                           stopped_early=record.stopped_early)
  guard.install()
  try:
    @tf.function
    def check():
      signal.raise_signal(signal.SIGTERM)  # Handled here, mid-trace.
      return tf.constant(True)
    assert bool(check())
    assert guard.stop_requested()
    assert 'received SIGTERM: stopping after the current step' in caplog.text
  finally:
    guard.uninstall()


@pytest.mark.parametrize('others,code', [
    ((False, False, True), 138),  # Another worker had the warning first.
    ((False, True, True), 143),  # SIGTERM anywhere: a stop, not a requeue.
])
def test_every_worker_stops_for_the_signal_the_job_received(others, code):
  """A signal reaches each worker at its own time; the verdict is combined
  over them (here: what the other workers add), so all exit alike."""
  guard = guards.LoopGuard(
      any_worker=lambda *flags: tuple(a or b for a, b in zip(flags, others)),
      last_checkpoint=lambda: None, dtype='fp32', stopped_early=lambda: True)
  with pytest.raises(guards.SignalReceived) as stop:
    guard(_loop([1.0], stopped_early=True))
  assert stop.value.exit_code == code


def test_a_repeated_warning_does_not_end_the_save_it_asked_for():
  guard = _guard()
  guard.install()
  try:
    signal.raise_signal(signal.SIGUSR1)
    signal.raise_signal(signal.SIGUSR1)  # Also through the launcher.
    with pytest.raises(guards.SignalReceived) as stop:
      guard(_loop([1.0]))
    assert stop.value.exit_code == 138
  finally:
    guard.uninstall()


def test_a_warning_held_through_start_up_stops_before_the_first_step():
  """The trainer holds the warning from its first line (common/
  interrupts.py): one that came while it imported or set up is the
  guard's at install, once, and the loop stops before its first step."""
  before = signal.getsignal(signal.SIGUSR1)
  interrupts.hold_warning()
  try:
    signal.raise_signal(signal.SIGUSR1)  # Would end the process unheld.
    guard = _guard()
    guard.install()
    try:
      assert guard.stop_requested()
      with pytest.raises(guards.SignalReceived) as stop:
        guard(_loop([1.0], stopped_early=True))
      assert stop.value.exit_code == 138
    finally:
      guard.uninstall()
    again = _guard()  # Taken: a later run of the process starts clean.
    again.install()
    try:
      assert not again.stop_requested()
    finally:
      again.uninstall()
  finally:
    signal.signal(signal.SIGUSR1, before)


def test_in_the_export_a_signal_stops_at_once_and_one_before_it_too():
  """No step comes to stop at in the export: the handler raises StopNow
  where Python next runs, and a signal of the last evaluation raises it as
  the export begins."""
  guard = _guard()
  with guard.installed():
    with pytest.raises(guards.StopNow) as stop:
      with guard.at_once():
        signal.raise_signal(signal.SIGHUP)
        pytest.fail('the export went on after SIGHUP')
    assert stop.value.exit_code == 129 and 'nohup' in stop.value.hint
  guard = _guard()
  with guard.installed():
    signal.raise_signal(signal.SIGUSR1)
    signal.raise_signal(signal.SIGTERM)
    with pytest.raises(guards.StopNow) as stop:
      with guard.at_once():
        pytest.fail('the export began after SIGTERM')
    assert stop.value.exit_code == 143  # A stop rather than a requeue.


def test_a_signal_ignored_at_the_start_stays_ignored():
  """nohup's SIGHUP: the run goes on when its terminal closes."""
  before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
  try:
    guard = _guard()
    with guard.installed():
      assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
      signal.raise_signal(signal.SIGHUP)
      assert not guard.stop_requested()
  finally:
    signal.signal(signal.SIGHUP, before)
