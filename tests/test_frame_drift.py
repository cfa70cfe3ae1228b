"""cdeit_jax.data.frame_drift: the drift between a target frame and its empty tank's, fitted
with the truth."""

import numpy as np
import pytest

from cdeit_jax import eit
from cdeit_jax.data import frame_drift
from cdeit_jax.eit.layout import preset
from cdeit_jax.infer.ktc_score import to_challenge_grid

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values


def _class_map():
  """Our grid (128, 128): a resistive disc and a conductive square."""
  c = (np.arange(128) - 63.5) / 64
  x, y = np.meshgrid(c, c)
  m = np.zeros((128, 128), np.uint8)
  m[(x - 0.3) ** 2 + (y + 0.2) ** 2 < 0.2**2] = 1
  m[(np.abs(x + 0.4) < 0.15) & (np.abs(y - 0.3) < 0.15)] = 2
  return m


def test_label_of_truth_inverts_the_challenge_grid():
  m = _class_map()
  got = frame_drift.label_of_truth(to_challenge_grid(m), 2.0)
  np.testing.assert_array_equal(got, 2.0 * (m == 2) - 2.0 * (m == 1))


def test_fit_recovers_an_injected_drift():
  """A target frame measured drift * (F(1) + F(truth)) in volts of gain g: the fit gives the
  drift, a = drift, the gain, and no residual; without the drift's term it cannot fit."""
  sim = eit.default_simulator(CDEIT16)
  m = _class_map()
  xs = 2.0 * (m == 2) - 2.0 * (m == 1)
  vh = np.asarray(sim.vh, np.float64)
  y = np.asarray(sim.image_voltages(xs[None].astype(np.float32)), np.float64)[0]
  gain, drift = 1500.0, 0.93
  reference = gain * vh
  frame = gain * drift * (vh + y)
  frame[:10] = np.nan  # a removed electrode's values
  got = frame_drift.fit(sim, reference, frame, to_challenge_grid(m), 2.0)
  assert abs(got["drift"] - drift) < 1e-4 and abs(got["a"] - drift) < 1e-3
  assert abs(got["gain"] - gain) < 1e-3 * gain
  assert got["residual"] < 1e-3 and got["residual_without_drift"] > 0.3


@pytest.mark.e2e
def test_the_command_says_bad_flags_and_folders_in_one_line(tmp_path):
  """--contrast 0, nan or negative (before: NaN fits with rc 0, or a LinAlgError),
  --contact_impedance 0, and a folder without levels: rc 1, one line naming the command's own
  flag (--data, not eval.py's --data_path), no traceback."""
  import subprocess
  import sys

  from conftest import REPO

  levels = REPO / "data" / "ktc2023" / "levels"
  for args, words in (
    ([f"--data={levels}", "--contrast=0"], "--contrast 0: must be a positive number (the obj"),
    ([f"--data={levels}", "--contrast=nan"], "--contrast nan: must be a positive number"),
    ([f"--data={levels}", "--contrast=-2"], "--contrast -2: must be a positive number"),
    ([f"--data={levels}", "--contact_impedance=0"], "--contact_impedance 0: must be a positive"),
    ([f"--data={tmp_path}"], f"--data {tmp_path}: no level_K folders"),
    (
      [f"--data={tmp_path / 'none'}"],
      f"--data {tmp_path / 'none'}: no such folder; give the challenge's folder of levels (the "
      "public data ship in data/ktc2023/levels)",
    ),
  ):
    p = subprocess.run(
      [sys.executable, "-m", "cdeit_jax.frame_drift", *args],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=120,
    )
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {words}"), p.stderr[-2000:]
    assert p.stdout == ""


def test_a_contrast_the_simulator_cannot_solve_is_one_line():
  """Objects at 10^8 times the water's conductivity (before: a LinAlgError traceback from
  --contrast 6 up): the float32 solve's voltages are not finite, and the fit says so naming the
  flag; 2 still fits."""
  import pytest

  from cdeit_jax.common.errors import InputError

  sim = eit.default_simulator(CDEIT16)
  m = _class_map()
  vh = np.asarray(sim.vh, np.float64)
  frame = 1500.0 * vh * 1.01
  with pytest.raises(InputError, match=r"--contrast 8: the simulator's voltages .* not finite"):
    frame_drift.fit(sim, 1500.0 * vh, frame, to_challenge_grid(m), 8.0)
  assert np.isfinite(frame_drift.fit(sim, 1500.0 * vh, frame, to_challenge_grid(m), 2.0)["a"])
