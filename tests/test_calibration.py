"""The calibration of a measuring system from its empty-tank frame (`cdeit_jax.eit.calibration`):
the fit recovers a simulated device's gain and contact impedance and fits the real KTC2023 tank;
frames that cannot be the empty tank are refused in one line naming the figure."""

import pathlib

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import calibration
from cdeit_jax.eit import layout as lay

LEVELS = pathlib.Path(__file__).parent.parent / "data" / "ktc2023" / "levels"


def test_calibration_recovers_a_simulated_device_and_fits_the_real_tank():
  """The fit finds the gain and contact impedance that made a reference frame (simulated with
  known values for a 16-electrode skip-2 device, 0.2 % noise, one electrode's values NaN), and
  on KTC2023's empty tank a gain within 1 % of the reference conversion's 1978
  (docs/reference/eit-conventions.md) at a residual under 10 %."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  frame = 1234.0 * calibration.homogeneous(layout, 0.05)
  frame *= 1 + 0.002 * np.random.default_rng(2).standard_normal(frame.shape)
  removed = (layout.rows[:, 1] == 5) | (layout.rows[:, 2] == 5)
  frame[removed] = np.nan
  fit = calibration.fit(layout, frame)
  assert fit.values == (~removed).sum()
  assert fit.gain == pytest.approx(1234.0, rel=2e-3)
  assert fit.contact_impedance == pytest.approx(0.05, rel=0.1) and fit.identifiable
  real, ref = lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))
  fit = calibration.fit(real, ref)
  assert fit.gain == pytest.approx(1978.0, rel=0.01) and fit.residual < 0.1, fit


def test_frames_that_cannot_be_the_empty_tank_are_refused():
  """A 16-electrode skip-2 device's simulated empty tank (gain 1234): negated (a flipped sign),
  a constant, noise, the frame in units no volts give (1e30), all zeros and an infinite value
  are each refused in one line that names the file and the figure; the real frame passes. The
  bound on the residual lies far from both sides: real tanks fit to under 0.1, these frames
  not under 0.99."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  frame = 1234.0 * calibration.homogeneous(layout, 0.05)
  frame *= 1 + 0.002 * np.random.default_rng(2).standard_normal(frame.shape)
  assert calibration.fit(layout, frame, "ref.mat").residual < 0.01
  noise = np.random.default_rng(3).standard_normal(frame.shape)
  inf = frame.copy()
  inf[7] = np.inf
  for bad, words in (
    (-frame, r"ref.mat: gain -123\d\.\d+ .*: the gain is not positive, so the frame's sign"),
    (np.full_like(frame, 0.5), r"relative residual (0\.99\d+|1\.0000) .*beyond 0.3 means"),
    (noise, r"relative residual (0\.99\d+|1\.0000) .*beyond 0.3 means the frame is not"),
    (1e30 * frame, r"gain 1\.23\d+e\+33 .*outside 1e-06\.\.1e\+12 measured per simulated volt"),
    (0 * frame, "ref.mat: every value is zero"),
    (inf, r"ref.mat: infinite values at \[7\]"),
  ):
    with pytest.raises(InputError, match=words) as e:
      calibration.fit(layout, bad, "ref.mat")
    assert "\n" not in str(e.value)
