"""cdeit_jax/train/log_windows.py: a log window's figures, its progress line and the time left."""

import numpy as np
import pytest

from cdeit_jax.train import log_windows
from cdeit_jax.train.log_windows import Window, duration, eta_s, progress_line


def _step(loss, grad_norm, lr=1e-3):
  return {
    "loss": np.float32(loss),
    "grad_norm": np.float32(grad_norm),
    "lr": np.float32(lr),
    "finite": np.bool_(True),
  }


def test_a_window_is_the_mean_of_its_steps_and_its_rates(monkeypatch):
  """Steps 11-15 with losses 0.1 ... 0.5: the window's loss is their mean (0.3), its gradient
  norm the last step's (and the largest); 5 steps of 8 examples in 2 s: 20 examples/s; 8 GFLOP a
  step on 8 devices at 2.5 steps/s: 0.0025 TFLOP/s a device, 0.25 % of a 1 TFLOP/s peak."""
  import time

  monkeypatch.setattr(log_windows.hardware, "peak_tflops", lambda: 1.0)
  w = Window(10, 8, 8e9)
  for loss, g in zip([0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 3.0, 2.0, 0.5, 0.7]):
    w.add(_step(loss, g))
  end = w.t0 + 2.0
  monkeypatch.setattr(time, "perf_counter", lambda: end)
  out = w.close(15, None, "wd")
  assert out["loss"] == pytest.approx(0.3, rel=1e-6)
  assert out["grad_norm"] == pytest.approx(0.7) and out["grad_norm_max"] == pytest.approx(3.0)
  assert out["samples_per_sec"] == pytest.approx(20.0)
  assert out["tflops_per_device"] == pytest.approx(8e9 / 8 * 2.5 / 1e12)
  assert out["fraction_of_peak"] == pytest.approx(0.0025)


def test_the_time_left_is_the_steps_left_at_the_rate_so_far():
  # 15 of 20 steps in 30 s from step 0: 2 s a step, 5 steps left
  assert eta_s(15, 20, 0, 30.0) == pytest.approx(10.0)
  # resumed at step 100 of 1,000: 50 steps in 25 s, 850 left at 0.5 s
  assert eta_s(150, 1000, 100, 25.0) == pytest.approx(425.0)
  assert eta_s(100, 1000, 100, 0.0) is None  # no step done yet
  assert [duration(s) for s in (0.4, 12, 250, 3 * 3600 + 5 * 60 + 20)] == [
    "0s",
    "12s",
    "4m10s",
    "3h05m",
  ]


def test_the_progress_line_shows_its_windows_record():
  m = {
    "loss": 0.0704527,
    "grad_norm": 0.14337,
    "lr": 0.001,
    "samples_per_sec": 24.4953,
    "tflops_per_device": 12.345,
    "fraction_of_peak": 0.0627,
    "val_loss": 0.0534,
    "eta_s": 250.0,
  }
  assert progress_line(15, 20, 10, m) == (
    "step 15/20: loss 0.07045 (mean of steps 11-15), grad norm 0.143, lr 0.001, 24.5 samples/s, "
    "12.3 TFLOP/s per device (6.3% of peak), val_loss 0.0534, ETA 4m10s"
  )
  del m["fraction_of_peak"], m["val_loss"]  # a CPU: no peak known; no validation here
  assert progress_line(20, 20, 19, m) == (
    "step 20/20: loss 0.07045 (mean of step 20), grad norm 0.143, lr 0.001, 24.5 samples/s, "
    "12.3 TFLOP/s per device"
  )  # the last step: no time left to show
