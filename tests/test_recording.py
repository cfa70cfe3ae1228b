"""eval.py --data recording (infer/recording.py) and the kinds of test data behind one registry
(infer/data_kinds.py)."""

import dataclasses
import pathlib

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.layout import preset
from cdeit_jax.infer import data_kinds

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

REPO = pathlib.Path(__file__).parent.parent
UEF = REPO / "data" / "uef2017"
UEF_GAIN = 1040.856  # the reference document's voltage ratio of the UEF2017 tank
SETTINGS = {"eval.max_examples": 3, "eval.figure": False, "eval.tikhonov": True}


def uef_recording(path, n=3, reference=None, targets=True):
  """The first `n` UEF2017 cases (sorted, as the npz source lists them) as one frames file:
  the difference voltages (n, 208) in the tank's units, plus `reference` when given (and then
  the reference frame stored beside them), the true images as `targets`."""
  names = sorted(p.name for p in UEF.glob("*.npz"))[:n]
  ys = np.stack([np.load(UEF / f)["ys"].reshape(-1) for f in names]).astype(np.float64)
  arrays = {"frames": ys if reference is None else ys + reference}
  if reference is not None:
    arrays["reference"] = reference
  if targets:
    arrays["targets"] = np.stack([np.load(UEF / f)["xs"] for f in names])
  np.savez(path, **arrays)
  return str(path)


def test_a_recording_scores_as_its_npz_files(tiny_run, tmp_path):
  """The same cases as one frames file with a reference frame (subtracted again in float64) and
  as the npz folder: the same images and the same CDEIT and Tikhonov scores."""
  folder = data_kinds.evaluate(tiny_run, "uef2017", str(UEF), str(tmp_path / "npz"), SETTINGS)
  ref = np.random.default_rng(0).uniform(0.5, 2.0, 208)
  rec_file = uef_recording(tmp_path / "rec.npz", reference=ref)
  got = data_kinds.evaluate(
    tiny_run, "recording", rec_file, str(tmp_path / "rec"), SETTINGS, units="uef2017"
  )
  for method in ("cdeit", "tikhonov"):
    for key in ("rmse", "psnr", "cc"):
      assert got["metrics"][method][key] == pytest.approx(
        folder["metrics"][method][key], rel=1e-5
      ), (method, key)
  a = np.load(tmp_path / "npz" / "predictions.npz")["pred"]
  b = np.load(tmp_path / "rec" / "predictions.npz")["pred"]
  np.testing.assert_allclose(b, a, atol=1e-5)
  assert got["settings"]["units"] == "uef2017" and got["settings"]["data"] == "recording"


def test_a_recording_is_read_in_the_models_units_and_checked(tiny_run, tmp_path):
  """Without --units a recording is in the model's device's units (CDEIT's 16 electrodes:
  the simulator's), so the tank's frames are refused as other units; a file without true
  images, absolute frames without their reference and kinds that are none are refused in one
  line each."""
  from cdeit_jax import eit

  rec_file = uef_recording(tmp_path / "rec.npz")
  with pytest.raises(InputError, match="standard deviations"):
    data_kinds.evaluate(tiny_run, "recording", rec_file, str(tmp_path / "a"), SETTINGS)
  bare = uef_recording(tmp_path / "bare.npz", targets=False)
  with pytest.raises(InputError, match="bare.npz: no `targets`"):
    data_kinds.evaluate(tiny_run, "recording", bare, str(tmp_path / "b"), SETTINGS, "uef2017")
  vh = np.asarray(eit.default_simulator(CDEIT16).vh, np.float64) * UEF_GAIN
  absolute = str(tmp_path / "absolute.npz")
  names = sorted(p.name for p in UEF.glob("*.npz"))[:3]
  ys = np.stack([np.load(UEF / f)["ys"].reshape(-1) for f in names])
  xs = np.stack([np.load(UEF / f)["xs"] for f in names])
  np.savez(absolute, frames=vh + ys, targets=xs)
  with pytest.raises(InputError, match="are absolute voltages"):
    data_kinds.evaluate(tiny_run, "recording", absolute, str(tmp_path / "c"), SETTINGS, "uef2017")
  assert not (tmp_path / "c").exists()
  with pytest.raises(InputError, match="--data 'tank': give one of simulated, uef2017, recording"):
    data_kinds.evaluate(tiny_run, "tank", str(UEF), str(tmp_path / "d"), SETTINGS)
  with pytest.raises(InputError, match="--units uef2017: --data ktc2023_challenge reads no units"):
    data_kinds.evaluate(tiny_run, "ktc2023_challenge", str(UEF), str(tmp_path / "e"), {}, "uef2017")
  with pytest.raises(InputError, match="unknown units 'volts'"):
    data_kinds.evaluate(tiny_run, "uef2017", str(UEF), str(tmp_path / "f"), SETTINGS, "volts")


def test_kinds_and_their_units():
  """Each kind names its module and default units; a named system's name is a folder of npz
  files in its units (the reference document's ratios), overridden one ratio at a time."""
  from cdeit_jax.eit import layout

  assert data_kinds.names() == ["simulated", "uef2017", "recording", "ktc2023_challenge", "greit"]
  k = data_kinds.get("ktc2023")
  assert (k.module, k.units) == ("cdeit_jax.infer.evaluate", "ktc2023")
  cdeit16 = layout.preset("cdeit16")
  u = k.units_of(None, cdeit16)  # a view of the model's device: its electrodes, the units' ratios
  assert (u.name, u.gain, u.current_ratio) == ("ktc2023", 1978.0, 2.0)
  assert u.same_system(cdeit16) and u.conductivity_factor == 2.0 / 1978.0
  u = data_kinds.get("uef2017").units_of(None, cdeit16, voltage_ratio=1000.0)
  assert (u.gain, u.current_ratio) == (1000.0, 2.0)
  device = layout.from_rules(16, injection="skip-2")
  calibrated = dataclasses.replace(device, gain=321.0, contact_impedance=0.01)
  u = data_kinds.get("recording").units_of(None, calibrated, current_ratio=3.0)
  assert (u.gain, u.current_ratio) == (321.0, 3.0)
  u = data_kinds.get("recording").units_of(None, device)
  assert (u.name, u.gain, u.current_ratio) == ("simulated", 1.0, 1.0)


def test_values_the_model_ignores_may_be_missing(tmp_path):
  """A device that measures on its current-carrying electrodes (256 values), its model leaving
  them out (config.model.current_carrying="drop"): frames without them (NaN) are scored, and
  their Tikhonov, of the values they hold, is CDEIT's 208-value system's of the same values (a
  second system that measures exactly those); NaN on another value names its row."""
  from cdeit_jax.eit import layout, tikhonov
  from cdeit_jax.infer.recording import RecordingSource
  from cdeit_jax.infer.run_frames import Frames

  full = layout.from_rules(16, measure_injecting=True)
  ignored = np.asarray(full.on_current_carrying, bool)
  assert ignored.sum() == 48
  held = {tuple(r): i for i, r in enumerate(full.rows.tolist())}
  index = [held[tuple(r)] for r in CDEIT16.rows.tolist()]
  ys = np.random.default_rng(0).normal(0, 1e-3, (3, 208))
  frames = np.full((3, 256), np.nan)
  frames[:, index] = ys
  targets = np.zeros((3, 128, 128), np.float32)
  np.savez(tmp_path / "rec.npz", frames=frames, targets=targets)
  mean, std = np.zeros(256), np.ones(256)
  nothing = np.zeros(256, bool)
  own = Frames(full)  # the model's own system's frames
  src = RecordingSource(str(tmp_path / "rec.npz"), own, full, mean, std, nothing, True, ignored)
  np.testing.assert_array_equal(src.absent, ignored)
  got = tikhonov.of_values(full, ~src.absent)(src.dv)
  want = tikhonov.of_values(CDEIT16)(ys.astype(np.float32))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
  frames[1, index[5]] = np.nan  # a value the model reads
  np.savez(tmp_path / "bad.npz", frames=frames, targets=targets)
  with pytest.raises(InputError, match=r"bad.npz: rows 1 miss other values"):
    RecordingSource(str(tmp_path / "bad.npz"), own, full, mean, std, nothing, True, ignored)
