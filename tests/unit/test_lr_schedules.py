"""Learning-rate schedules against hand-computed values."""

import pytest

from resnet_keras.optimization import lr_schedules
from resnet_keras.config import RunConfig


def lr(schedule, step):
  return float(schedule(step).numpy())


def test_peak_scales_sgd_with_batch_but_not_lars():
  def peak(optimizer, base, batch):
    return lr_schedules.peak_learning_rate(
        RunConfig(optimizer=optimizer, base_learning_rate=base), batch)
  assert peak('SGD', 0.1, 1024) == pytest.approx(0.4)
  assert peak('LARS', 9.5, 2048) == 9.5
  assert peak('RMSProp', 0.016, 512) == pytest.approx(0.032)


def test_piecewise_warmup_and_boundaries():
  # 100 steps/epoch, 5 warmup epochs, peak 0.4 (0.1 x 1024/256).
  s = lr_schedules.build_schedule('piecewise', peak=0.4, warmup_steps=500,
                               total_steps=9000, steps_per_epoch=100)
  assert lr(s, 0) == 0.0
  assert lr(s, 250) == pytest.approx(0.2)       # half way through warmup
  assert lr(s, 499) == pytest.approx(0.4 * 499 / 500)
  assert lr(s, 500) == pytest.approx(0.4)       # warmup end: the peak
  assert lr(s, 3000) == pytest.approx(0.4)      # boundary is exclusive
  assert lr(s, 3001) == pytest.approx(0.04)     # x0.1 after epoch 30
  assert lr(s, 6001) == pytest.approx(0.004)
  assert lr(s, 8001) == pytest.approx(0.0004)
  assert lr(s, 8999) == pytest.approx(0.0004)   # last step


def test_polynomial_warmup_peak_and_power_two_decay():
  # Warmup 10 steps to 2.5, then (2.5 - 1e-4)(1 - t/90)^2 + 1e-4 over 90.
  s = lr_schedules.build_schedule('polynomial', peak=2.5, warmup_steps=10,
                               total_steps=100, steps_per_epoch=10,
                               end_learning_rate=1e-4)
  assert lr(s, 5) == pytest.approx(1.25)
  assert lr(s, 10) == pytest.approx(2.5)
  assert lr(s, 55) == pytest.approx((2.5 - 1e-4) * 0.25 + 1e-4, rel=1e-5)
  assert lr(s, 100) == pytest.approx(1e-4)
  assert lr(s, 99) == pytest.approx((2.5 - 1e-4) * (1 / 90) ** 2 + 1e-4,
                                    rel=1e-4)


def test_polynomial_decay_epochs_end_early_and_stay():
  s = lr_schedules.build_schedule('polynomial', peak=1.0, warmup_steps=0,
                               total_steps=100, steps_per_epoch=10,
                               end_learning_rate=0.0, decay_steps=50)
  assert lr(s, 0) == pytest.approx(1.0)
  assert lr(s, 25) == pytest.approx(0.25)
  assert lr(s, 50) == pytest.approx(0.0)
  assert lr(s, 80) == pytest.approx(0.0)


def test_cosine_and_constant():
  s = lr_schedules.build_schedule('cosine', peak=1.0, warmup_steps=10,
                               total_steps=110, steps_per_epoch=10,
                               end_learning_rate=0.0)
  assert lr(s, 10) == pytest.approx(1.0)
  assert lr(s, 60) == pytest.approx(0.5, abs=1e-6)   # half way: cos(pi/2)
  assert lr(s, 110) == pytest.approx(0.0, abs=1e-6)
  c = lr_schedules.build_schedule('constant', peak=0.3, warmup_steps=4,
                               total_steps=50, steps_per_epoch=10)
  assert lr(c, 2) == pytest.approx(0.15)
  assert lr(c, 4) == pytest.approx(0.3)
  assert lr(c, 49) == pytest.approx(0.3)


def test_linear_warms_up_then_falls_to_zero_at_the_last_step():
  # FFCV's shape: 0 -> 1.7 over 5 steps, then 1.7 (1 - (t - 5) / 20) to 0
  # at step 25; the end_learning_rate floor of the other decays is ignored.
  s = lr_schedules.build_schedule('linear', peak=1.7, warmup_steps=5,
                               total_steps=25, steps_per_epoch=5,
                               end_learning_rate=0.1)
  assert lr(s, 0) == 0.0
  assert lr(s, 1) == pytest.approx(0.34)
  assert lr(s, 5) == pytest.approx(1.7)
  assert lr(s, 10) == pytest.approx(1.275)   # a quarter of the decay
  assert lr(s, 15) == pytest.approx(0.85)    # half way
  assert lr(s, 24) == pytest.approx(0.085)
  assert lr(s, 25) == pytest.approx(0.0, abs=1e-7)
  assert lr(s, 30) == pytest.approx(0.0, abs=1e-7)  # stays there
  # Without warmup it starts at the peak.
  cold = lr_schedules.schedule_for_run(
      RunConfig(optimizer='LARS', base_learning_rate=2.0, warmup_epochs=0,
                lr_schedule='linear'),
      global_batch_size=256, steps_per_epoch=10, total_steps=40)
  assert lr(cold, 0) == pytest.approx(2.0)
  assert lr(cold, 20) == pytest.approx(1.0)


def test_per_epoch_holds_each_epoch_at_its_middle():
  # 4 epochs of 10 steps, linear: 1 epoch of warmup to 2.0, then to 0 at
  # step 40. Each epoch takes the value at its step 5, 15, 25, 35.
  cfg = RunConfig(optimizer='LARS', base_learning_rate=2.0, warmup_epochs=1,
                  lr_schedule='linear', lr_per_epoch=True)
  s = lr_schedules.schedule_for_run(cfg, global_batch_size=256,
                                 steps_per_epoch=10, total_steps=40)
  for epoch, value in enumerate([1.0, 2 * 25 / 30, 2 * 15 / 30, 2 * 5 / 30]):
    for step in (10 * epoch, 10 * epoch + 9):
      assert lr(s, step) == pytest.approx(value), (epoch, step)
  assert lr(s, 40) == pytest.approx(0.0, abs=1e-7)  # past the run


def test_a_scaled_schedule_is_the_planned_one_times_the_factor():
  cfg = RunConfig(optimizer='SGD', base_learning_rate=0.1, warmup_epochs=1,
                  lr_schedule='linear')
  planned = lr_schedules.schedule_for_run(cfg, global_batch_size=512,
                                       steps_per_epoch=10, total_steps=40)
  scaled = lr_schedules.schedule_for_run(cfg, global_batch_size=512,
                                      steps_per_epoch=10, total_steps=40,
                                      scale=0.5)
  assert lr(planned, 10) == pytest.approx(0.2)  # 0.1 per 256 at 512.
  for step in (0, 5, 10, 25, 39):
    assert lr(scaled, step) == pytest.approx(0.5 * lr(planned, step))
  assert lr_schedules.schedule_for_run(cfg, 512, 10, 40, scale=1.0).__class__ \
      is planned.__class__  # No wrapper when nothing is scaled.


def test_schedule_for_run_uses_flags():
  cfg = RunConfig(optimizer='LARS', base_learning_rate=9.5, warmup_epochs=3,
                  lr_schedule='polynomial', lars_decay_epochs=10,
                  end_learning_rate=1e-4)
  s = lr_schedules.schedule_for_run(cfg, global_batch_size=2048,
                                 steps_per_epoch=10, total_steps=400)
  assert lr(s, 30) == pytest.approx(9.5)
  assert lr(s, 100) == pytest.approx(1e-4)
  assert lr(s, 200) == pytest.approx(1e-4)


def test_stepped_decays_at_fractions_of_the_run():
  # 1000 steps, warmup 100 to 1.0, x0.5 after 30%, 60% and 80% of the run.
  s = lr_schedules.build_schedule('stepped', peak=1.0, warmup_steps=100,
                               total_steps=1000, steps_per_epoch=10,
                               decay_factor=0.5, decay_points=(0.3, 0.6, 0.8))
  assert lr(s, 50) == pytest.approx(0.5)
  assert lr(s, 100) == pytest.approx(1.0)
  assert lr(s, 300) == pytest.approx(1.0)     # boundary is exclusive
  assert lr(s, 301) == pytest.approx(0.5)
  assert lr(s, 600) == pytest.approx(0.5)
  assert lr(s, 601) == pytest.approx(0.25)
  assert lr(s, 801) == pytest.approx(0.125)
  assert lr(s, 999) == pytest.approx(0.125)


def test_exponential_staircase_after_warmup():
  # 10 steps/epoch, warmup 10 steps to 2.0, x0.5 every 2 epochs after it.
  s = lr_schedules.build_schedule('exponential', peak=2.0, warmup_steps=10,
                               total_steps=100, steps_per_epoch=10,
                               decay_factor=0.5, decay_epochs=2)
  assert lr(s, 5) == pytest.approx(1.0)
  assert lr(s, 10) == pytest.approx(2.0)      # the peak at warmup end
  assert lr(s, 29) == pytest.approx(2.0)
  assert lr(s, 30) == pytest.approx(1.0)
  assert lr(s, 55) == pytest.approx(2.0 * 0.5 ** 2)  # 45 steps in: 2 decays
  assert lr(s, 99) == pytest.approx(2.0 * 0.5 ** 4)


def test_schedule_for_run_stepped_and_exponential_flags():
  stepped = RunConfig(lr_schedule='stepped', base_learning_rate=0.1,
                      warmup_epochs=1, lr_decay_factor=0.2,
                      lr_decay_points=(0.5,))
  s = lr_schedules.schedule_for_run(stepped, global_batch_size=512,
                                 steps_per_epoch=10, total_steps=200)
  assert lr(s, 5) == pytest.approx(0.1)      # warmup to 0.2 (0.1 x 512/256)
  assert lr(s, 100) == pytest.approx(0.2)
  assert lr(s, 101) == pytest.approx(0.04)
  exponential = RunConfig(optimizer='RMSProp', lr_schedule='exponential',
                          base_learning_rate=0.016, warmup_epochs=0,
                          lr_decay_factor=0.97, lr_decay_epochs=2.4)
  s = lr_schedules.schedule_for_run(exponential, global_batch_size=1024,
                                 steps_per_epoch=100, total_steps=5000)
  assert lr(s, 0) == pytest.approx(0.064)    # RMSProp scales like SGD
  assert lr(s, 239) == pytest.approx(0.064)
  assert lr(s, 240) == pytest.approx(0.064 * 0.97)
  assert lr(s, 4800) == pytest.approx(0.064 * 0.97 ** 20)
