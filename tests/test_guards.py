"""The loop guard: non-finite losses and weights stop a run with one line
naming what was kept and the likely causes; a signal asks for a stop after
the current step."""

import os
import signal

import numpy as np
import pytest

from common.errors import RunStopped
from resnet_keras import guards
from resnet_keras.trainer import LoopRecord


def _loop(losses, weights_finite=True, stopped_early=False):
  return LoopRecord(first_step=5, losses=np.array(losses, np.float32),
                    accuracies=np.zeros(len(losses)), seconds=1.0,
                    input_wait_seconds=0.0, weights_finite=weights_finite,
                    stopped_early=stopped_early)


def _guard(loop, checkpoint=None, dtype='fp32'):
  return guards.LoopGuard(get_loop=lambda: loop, any_worker=lambda *f: f,
                          last_checkpoint=lambda: checkpoint, dtype=dtype)


def test_finite_loops_go_on():
  _guard(_loop([1.0, 0.9]))(None)


def test_a_non_finite_loss_stops_at_its_step():
  with pytest.raises(RunStopped) as stopped:
    _guard(_loop([1.0, np.nan, 2.0]), checkpoint='/m/ckpt-4')(None)
  assert stopped.value.exit_code == guards.NON_FINITE_EXIT_CODE
  message = str(stopped.value)
  assert message.startswith('training loss is nan at step 6; stopped, the '
                            'last checkpoint (/m/ckpt-4) is kept.')
  assert 'fp16' not in message and 'corrupt input data' in message


def test_a_non_finite_weight_stops_after_the_loop_and_fp16_is_named():
  with pytest.raises(RunStopped, match='non-finite after step 6 .*no '
                     'checkpoint was written.*fp16 overflow'):
    _guard(_loop([1.0, 0.9], weights_finite=False), dtype='fp16')(None)


def test_a_loop_a_stop_ended_raises_the_signal():
  with pytest.raises(guards.SignalReceived) as received:
    _guard(_loop([1.0], stopped_early=True))(None)
  assert received.value.exit_code == 128 + signal.SIGTERM


def test_a_signal_is_a_stop_request_until_uninstalled():
  guard = _guard(_loop([1.0]))
  guard.install()
  try:
    assert not guard.stop_requested()
    os.kill(os.getpid(), signal.SIGINT)  # Handled: no KeyboardInterrupt.
    assert guard.stop_requested()
    with pytest.raises(guards.SignalReceived, match='SIGINT'):
      guard(None)
  finally:
    guard.uninstall()
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_non_finite_step_is_the_first_bad_one():
  assert guards.non_finite_step(np.array([1.0, np.inf, np.nan]), 10) == 11
  assert guards.non_finite_step(np.array([1.0, 2.0]), 10) is None
