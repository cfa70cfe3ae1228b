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
PROTOCOLS = pathlib.Path(__file__).parent.parent / "data" / "uef2017_protocols"


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
  assert fit.contact_impedance == pytest.approx(0.05, rel=0.1)
  assert fit.identifiable == {"contact_impedance": True}
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
    (np.full_like(frame, 0.5), r"ref.mat: current pattern 0's 16 values are all 0.5, which no"),
    (noise, r"relative residual (0\.99\d+|1\.0000) .*beyond 0.3 means the frame is not"),
    (1e30 * frame, r"gain 1\.23\d+e\+33 .*outside 1e-06\.\.1e\+12 measured per simulated volt"),
    (0 * frame, "ref.mat: every value is zero"),
    (inf, r"ref.mat: infinite values at \[7\]"),
  ):
    with pytest.raises(InputError, match=words) as e:
      calibration.fit(layout, bad, "ref.mat")
    assert "\n" not in str(e.value)


def test_a_pattern_of_constant_values_is_refused_and_calibrates_as_missing():
  """One current pattern whose values are all one number (a stuck channel, a placeholder) in an
  otherwise good frame: the fit would take it (the issue's UEF2017 case: residual 0.25 against
  0.014, the gain 5.6 % low), so it is refused in one line naming the pattern, whichever pattern
  and value; the same values given as NaN calibrate as the frame without them."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  frame = 1234.0 * calibration.homogeneous(layout, 0.05)
  frame *= 1 + 0.002 * np.random.default_rng(2).standard_normal(frame.shape)
  for k, value in ((3, None), (11, 0.0)):
    bad = frame.copy()
    of_k = layout.rows[:, 0] == k
    bad[of_k] = np.mean(frame[of_k]) if value is None else value
    with pytest.raises(
      InputError, match=rf"ref.mat: current pattern {k}'s 16 values are all "
    ) as e:
      calibration.fit(layout, bad, "ref.mat")
    assert "\n" not in str(e.value) and "NaN (missing)" in str(e.value)
  bad[of_k] = np.nan
  fit = calibration.fit(layout, bad, "ref.mat")
  assert fit.values == layout.num_values - 16 and fit.gain == pytest.approx(1234.0, rel=0.01)


def test_the_electrode_width_is_fitted_where_the_frame_determines_it():
  """A 16-electrode skip-2 device with 10-degree electrodes and a small contact impedance (gain
  1234, z = 1e-3), as UEF2017's tank: read as 4-degree electrodes the fit is 20 times worse and
  its gain over 20 % low; with `width=True` the gain comes within 1 %. Noise-free, the frame
  determines the width (within half a degree, identifiable); with 0.2 % noise, above the true
  width z makes up for any width, so the width is not identifiable, its range starts within a
  degree of the truth and reaches the search's bound, and the nominal width is the range's
  middle. A width the user gives is held, and KTC2023's tank does not determine its width."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  model = calibration.homogeneous_model(layout)
  exact = 1234.0 * model(1e-3, np.deg2rad(10.0))
  frame = exact * (1 + 0.002 * np.random.default_rng(4).standard_normal(exact.shape))
  narrow = calibration.fit(layout, frame, "ref.mat")
  fit = calibration.fit(layout, frame, "ref.mat", width=True)
  assert narrow.residual > 20 * fit.residual and narrow.gain < 0.8 * 1234.0
  assert fit.gain == pytest.approx(1234.0, rel=0.01) and fit.residual < 0.003
  clean = calibration.fit(layout, exact, "ref.mat", width=True)
  assert clean.identifiable["width_deg"] and clean.width_deg == pytest.approx(10.0, abs=0.5)
  assert " +- " in clean.describe() and "not identifiable" not in clean.describe().split("width")[1]
  lo, hi = fit.ranges["width_deg"]
  assert not fit.identifiable["width_deg"] and 9.0 <= lo <= 10.0 and hi == pytest.approx(20.25)
  assert fit.width_deg == pytest.approx((lo + hi) / 2)
  assert f"degrees (not identifiable: {lo:.3g} to 20.2 fit as well)" in fit.describe()
  held = calibration.fit(layout, frame, "ref.mat", width=True, width_deg=10.0)
  assert held.width_deg == 10.0 and "width_deg" not in held.errors
  assert "width_deg" not in held.identifiable and "width_deg" not in held.ranges
  assert held.residual < 0.003 and held.contact_impedance == pytest.approx(1e-3, rel=0.3)
  ktc, ref = lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))
  wide = calibration.fit(ktc, ref, "ref.mat", width=True)
  assert not wide.identifiable["width_deg"], wide.describe()


def test_the_true_width_lies_in_the_range_that_fits_as_well():
  """z and the width trade off along a valley: with noise (0.2 % of the rms, as the
  simulator's), devices along it are fitted with ranges that hold their true width and z, and
  whose narrowest width is within 2 degrees of the truth (the frame fixes where the valley
  starts); the gain within 0.3 %."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  model = calibration.homogeneous_model(layout)
  rng = np.random.default_rng(0)
  for z, width in ((1e-3, 10.2), (3e-4, 12.0), (1e-2, 6.0)):
    frame = 800.0 * model(z, np.deg2rad(width))
    frame = frame + 0.002 * np.sqrt(np.mean(frame**2)) * rng.standard_normal(frame.shape)
    fit = calibration.fit(layout, frame, width=True)
    lo, hi = fit.ranges["width_deg"]
    assert lo <= width <= hi and width - lo < 2.0, (width, fit.describe())
    z_lo, z_hi = fit.ranges["contact_impedance"]
    assert z_lo <= z <= z_hi, (z, fit.describe())
    assert fit.gain == pytest.approx(800.0, rel=0.003)


@pytest.mark.parametrize("protocol", ["skip1", "skip3"])
def test_real_skip_devices_are_not_said_to_determine_what_they_cannot(protocol):
  """UEF2017's tank measured with skip-1 and skip-3 patterns (data/uef2017_protocols: 256
  values, current-carrying electrodes included; electrodes 2.5 cm on a 28 cm tank, 10.2
  degrees). The fit used to run to the width search's bound (20.25 degrees, +- 2.2) and call it
  identifiable. The width and z are now not identifiable; the width's range holds 10.2 and
  starts below 10.5 (the valley's start); the gain is the tank's (1041-1074 over protocols),
  and the device's model draws its system across the ranges, within the simulator's limits."""
  from cdeit_jax import calibrate

  real, ref = lay.from_device_file(str(PROTOCOLS / protocol / "ref.mat"))
  fit = calibration.fit(real, ref, "ref.mat", width=True)
  assert fit.identifiable == {"contact_impedance": False, "width_deg": False}, fit.describe()
  lo, hi = fit.ranges["width_deg"]
  assert lo < 10.5 and 10.2 < hi and 1040 < fit.gain < 1080 and fit.residual < 0.02
  assert "not identifiable: " in fit.describe() and fit.undetermined
  line = calibrate.what_follows(fit, None)
  assert f"trained across {lo:.3g} to 20 (the simulator's widest; {hi:.3g} fit as well)" in line
  assert "--width_deg" in line and fit.errors["width_deg"] == pytest.approx((hi - lo) / 2)
  held = calibration.fit(real, ref, "ref.mat", width=True, width_deg=10.2)
  assert held.width_deg == 10.2 and "the electrode width is given" in calibrate.what_follows(
    held, 10.2
  )
  assert calibrate.given_width(None, 2.5, 28.0) == pytest.approx(10.23, abs=0.01)


def test_a_bad_electrode_is_named_and_the_frame_fits_without_it():
  """UEF2017's skip-1 empty tank with electrode 5's values (measured on it or driven through it)
  replaced by noise: refused in one line that names electrode 5 and its share of the misfit;
  the same frame with those values NaN, as the message advises, calibrates."""
  device, ref = lay.from_device_file(str(PROTOCOLS / "skip1" / "ref.mat"))
  rows = device.rows
  hit = (rows[:, 1] == 5) | (rows[:, 2] == 5) | (device.currents[5, rows[:, 0]] != 0)
  bad = ref.copy()
  bad[hit] = np.random.default_rng(0).standard_normal(hit.sum()) * np.abs(ref).max()
  with pytest.raises(InputError, match=r"electrode 5's values \(60 of 256\) hold 9\d% of the") as e:
    calibration.fit(device, bad, "bad.mat")
  assert "\n" not in str(e.value) and "disconnected" in str(e.value)
  bad[hit] = np.nan
  fit = calibration.fit(device, bad, "bad.mat")
  assert fit.values == 256 - 60 and fit.residual < calibration.MAX_RESIDUAL
