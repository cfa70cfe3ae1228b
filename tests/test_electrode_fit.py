"""`eit.electrode_fit`: each electrode's contact impedance, centre and width around the global
calibration, checked on a simulated device whose electrodes truly differ (the values it was made
with are the truth); on UEF2017's real tank through the calibrate command
(tests/test_device.py: held-out patterns, where the global fit holds)."""

import jax
import numpy as np

from cdeit_jax.eit import calibration, electrode_fit
from cdeit_jax.eit import layout as lay


def test_electrodes_that_differ_are_found():
  """A skip-2 device whose electrode 3 sits 1.5 degrees off and whose electrode 7 has 10x the
  contact impedance (noise 1e-4 of the frame): the global fit leaves a residual of 0.15; the fit
  per electrode finds both, brings the residual to the noise, and predicts held-out patterns
  better than the global fit."""
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  model = calibration.homogeneous_model(layout)
  log10_z = np.full(16, -2.0)
  log10_z[7] = -1.0
  centres = np.array(layout.angles, np.float64)
  centres[3] += np.deg2rad(1.5)
  widths = np.full(16, np.deg2rad(10.0))
  with jax.enable_x64(True):
    clean = 800.0 * np.asarray(model.electrodes(log10_z, centres, widths), np.float64)
  rng = np.random.default_rng(0)
  ref = clean + 1e-4 * np.linalg.norm(clean) / np.sqrt(len(clean)) * rng.standard_normal(len(clean))
  g = calibration.fit(layout, ref, width=True)
  assert g.residual > 1e-3
  f = electrode_fit.fit(layout, ref, g)
  offsets = f.centres_deg - np.rad2deg(layout.angles)
  # against the others' (a turn of every electrode together fits alike: the prior holds it)
  assert abs(offsets[3] - np.median(offsets) - 1.5) < 0.25
  # electrode 7 a decade above the others (the width and contact impedance of all trade off
  # together along the valley: the global fit's range), the others alike
  log_z = np.log10(f.contact_impedance)
  others = np.delete(log_z, 7)
  assert abs(log_z[7] - np.median(others) - 1.0) < 0.3
  assert np.ptp(others) < 0.1
  assert f.determined["centre_deg"][3]
  assert f.residual < 2e-4  # the noise
  held = electrode_fit.held_out(layout, ref, g)
  assert held["per_electrode"] < 0.5 * held["global"]
  assert "the frame determines the centres of" in f.describe(held)
