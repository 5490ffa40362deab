"""--profile_steps's window against the loops it falls in
(reporting._Profiler): orbit runs actions only between loops, so the
profile must start at the boundary before the loop that runs the window,
wherever the window lies."""

import glob

import pytest
import tensorflow as tf

from resnet_keras.training import reporting


def _profile(tmp_path, window, boundaries, steps_per_loop=117, stop_at=None):
  """Drives a profiler through `boundaries` (the step before the first loop,
  then each loop's end); returns the steps where it was running."""
  step = tf.Variable(boundaries[0], dtype=tf.int64)
  stop_at = stop_at or (lambda s: 10**9)
  profiler = reporting._Profiler(  # pylint: disable=protected-access
      *window, logdir=str(tmp_path / 'profile'), global_step=step,
      next_loop_end=lambda s: min(s + steps_per_loop, stop_at(s)))
  running = []
  for boundary in boundaries:
    step.assign(boundary)
    profiler()
    if profiler._active:  # pylint: disable=protected-access
      running.append(boundary)
  profiler.finish()
  return running


@pytest.mark.parametrize('window,running', [
    # Between two boundaries (234 and 351): the loop 234 -> 351 is profiled.
    ((240, 250), [234]),
    # On boundaries: as before, exactly the loops from 234 to 468.
    ((234, 468), [234, 351]),
    # In the first loop: the profile starts before it.
    ((10, 20), [0]),
])
def test_the_window_is_profiled_wherever_it_falls(tmp_path, window, running):
  assert _profile(tmp_path, window, [0, 117, 234, 351, 468, 585]) == running
  assert glob.glob(str(tmp_path / 'profile' / '**' / '*.xplane.pb'),
                   recursive=True)


def test_a_shorter_loop_before_an_evaluation_is_accounted_for(tmp_path):
  # Epochs of 200 steps: orbit's loops end at 117 and 200 (the epoch's
  # stop), then 317; a window at 205 runs in the loop after 200.
  running = _profile(tmp_path, (205, 210), [0, 117, 200, 317, 400],
                     stop_at=lambda s: (s // 200 + 1) * 200)
  assert running == [200]


def test_a_window_past_the_run_says_so(tmp_path, caplog):
  assert _profile(tmp_path, (900, 910), [0, 117, 234]) == []
  assert 'no step in the window (it ended at step 234)' in caplog.text
  assert not (tmp_path / 'profile').exists()


def test_a_run_resumed_past_the_window_says_so(tmp_path, caplog):
  assert _profile(tmp_path, (10, 20), [351, 468]) == []
  assert 'no step in the window (it ended at step 468)' in caplog.text
