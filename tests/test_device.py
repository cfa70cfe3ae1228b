"""Your device (docs/your_device.md): `python -m cdeit_jax.calibrate` writes the calibrated device
that `configs/device.py` trains for, its measuring system drawn per example around the
calibration (`eit.system.draw` for any layout), and a model of it reconstructs the device's own
frames in its own units after the device file is gone (`make device-model`, slow)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.io

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import calibration
from cdeit_jax.eit import layout as lay

REPO = pathlib.Path(__file__).parent.parent
PROTOCOLS = REPO / "data" / "uef2017_protocols"
WIDTH, Z, GAIN = 10.0, 1e-3, 800.0


def _device(path: pathlib.Path, layout, values) -> None:
  """A device file in UEF's keys: currents, the shared measurement pattern, the values as one
  column per pattern."""
  pairs = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  mpat = np.zeros((layout.num_electrodes, len(pairs)))
  mpat[pairs[:, 0], np.arange(len(pairs))], mpat[pairs[:, 1], np.arange(len(pairs))] = 1, -1
  v = np.asarray(values).reshape(layout.num_patterns, len(pairs)).T
  scipy.io.savemat(path, {"CurrentPattern": 2e-3 * layout.currents, "MeasPattern": mpat, "Uel": v})


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
  """A 16-electrode skip-2 device (UEF's keys, 10-degree electrodes, z = 1e-3, gain 800) and the
  calibrated device the command makes of its empty tank."""
  root = tmp_path_factory.mktemp("device")
  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  ref = GAIN * calibration.homogeneous_model(layout)(Z, np.deg2rad(WIDTH))
  _device(root / "ref.mat", layout, ref)
  p = subprocess.run(
    [
      sys.executable,
      "-m",
      "cdeit_jax.calibrate",
      f"--device={root / 'ref.mat'}",
      f"--out={root / 'device.npz'}",
      "--noelectrodes",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert p.stdout.count("\n") == 1 and f"its record: {root / 'device.json'}" in p.stdout
  return root, layout, ref, json.loads((root / "device.json").read_text()), p.stderr


def test_the_calibrated_device_is_what_every_command_reads(calibrated):
  """The command logs and prints the fit (gain within 1 %, the width within 25 %); the device
  file it writes reads back as the device (its rows, the fitted width, gain and contact
  impedance), and configs/device.py trains for it with its system drawn around the fit."""
  root, layout, _, fit, err = calibrated
  assert "calibration of ref.mat (UEF keys)" in err and "electrode width" in err, err
  assert fit["gain"] == pytest.approx(GAIN, rel=0.01) and fit["width_deg"] == pytest.approx(
    WIDTH, rel=0.25
  )
  device, values = lay.from_device_file(str(root / "device.npz"))
  np.testing.assert_array_equal(device.rows, layout.rows)
  np.testing.assert_allclose(device.angles, layout.angles, atol=1e-12)
  assert np.rad2deg(device.width) == pytest.approx(fit["width_deg"])
  assert device.gain == fit["gain"] and device.contact_impedance == fit["contact_impedance"]
  assert values.shape == (256,)
  cfg = config_lib.load(f"{REPO / 'configs' / 'device.py'}:{root / 'device.npz'}")
  s = cfg.simulator
  assert s.layout == str(root / "device.npz") and s.contact_impedance == fit["contact_impedance"]
  assert tuple(s.system.width_deg) == pytest.approx(
    (0.9 * fit["width_deg"], 1.1 * fit["width_deg"])
  )
  assert cfg.model.cond == "linear"
  with pytest.raises(InputError, match="configs/device.py needs the calibrated device"):
    config_lib.load(str(REPO / "configs" / "device.py"))


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", ["skip1", "skip3"])
def test_a_real_device_gets_through_from_its_calibration_to_its_simulations(
  protocol, tmp_path, caplog
):
  """UEF2017's tank under skip-1 and skip-3 patterns (data/uef2017_protocols), calibrated by the
  command with no width given: the width and z are not identifiable, the log says so and that
  the model is trained across their ranges; configs/device.py then draws them across those
  ranges (the width's end clipped to the simulator's 20 degrees, in one log line) instead of
  stopping on a config error, and the simulator measures examples with them. Each electrode's
  own values, fitted too, are not confirmed by held-out patterns (`eit.electrode_fit`)."""
  import jax

  from cdeit_jax.data import synthetic

  device = tmp_path / "device.npz"
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.calibrate", f"--device={PROTOCOLS / protocol / 'ref.mat'}"]
    + [f"--out={device}"]
    + ([] if protocol == "skip1" else ["--noelectrodes"]),  # the per-electrode fit: skip-1's
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  fit = json.loads((tmp_path / "device.json").read_text())
  assert fit["identifiable"] == {"contact_impedance": False, "width_deg": False}
  assert "the frame does not determine the electrode width: a model for this device" in p.stderr
  # each electrode's own values fit the frame better and held-out patterns worse (the model's
  # error, not the electrodes'): said, and the device keeps the global fit
  if protocol == "skip1":
    each = fit["electrodes"]
    assert each["residual"] < 0.8 * fit["residual"]
    assert each["held_out"]["per_electrode"] > each["held_out"]["global"]
    assert not any(any(v) for v in each["determined"].values())
    assert "does not determine the electrodes' own values" in p.stderr
  (w_lo, w_hi), (z_lo, z_hi) = fit["ranges"]["width_deg"], fit["ranges"]["contact_impedance"]
  assert w_lo < 10.2 < w_hi and w_hi > 20.0
  with np.load(device) as d:
    np.testing.assert_allclose(d["width_range_deg"], (w_lo, w_hi))
  with caplog.at_level("INFO", logger="cdeit_jax"):
    cfg = config_lib.load(f"{REPO / 'configs' / 'device.py'}:{device}")
  clipped = [r.getMessage() for r in caplog.records if "the simulator's limits" in r.getMessage()]
  assert len(clipped) == 1 and f"width_deg drawn from {w_lo:.4g} to 20," in clipped[0], clipped
  spread = cfg.simulator.system
  assert tuple(spread.width_deg) == pytest.approx((w_lo, 20.0))
  lo, hi = spread.contact_impedance
  assert lo <= z_lo and hi >= z_hi
  gen = synthetic.generator(cfg.simulator)
  systems = gen.systems(jax.random.split(jax.random.key(0), 4))
  width = np.rad2deg(2 * np.asarray(systems.half_widths))
  assert width.shape == (4, 16) and w_lo * 0.95 <= width.min() and width.max() <= 20.0 * 1.05


@pytest.mark.e2e
def test_a_run_of_one_device_is_not_given_another(tmp_path):
  """`make device-model` into the RUN of another device: its calibration (skip-3) is refused
  before RUN/device.npz (skip-1, which RUN's checkpoints were made for) is replaced, in one line
  that names the difference (the patterns, which the two files' names do not show); the same
  device again (a rerun that resumes) is written as before."""
  run = tmp_path / "RUN"
  device = run / "device.npz"

  def calibrate(protocol):
    return subprocess.run(
      [sys.executable, "-m", "cdeit_jax.calibrate", f"--device={PROTOCOLS / protocol / 'ref.mat'}"]
      + [f"--out={device}", "--noelectrodes"],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=300,
    )

  assert calibrate("skip1").returncode == 0
  (run / "checkpoints").mkdir()  # what the run made for it
  before = device.read_bytes()
  p = calibrate("skip3")
  errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
  assert p.returncode == 1 and len(errors) == 1, p.stderr[-3000:]
  assert "16 patterns, skip 1, 256 values), where --device is" in errors[0]
  assert "16 patterns, skip 3, 256 values)" in errors[0] and "a run is one device" in errors[0]
  assert "calibration of" not in p.stderr  # refused before the fit
  assert device.read_bytes() == before
  p = calibrate("skip1")
  assert p.returncode == 0, p.stderr[-3000:]


def test_systems_drawn_around_a_device(calibrated):
  """The simulated examples of configs/device.py: each measured by its own system drawn around
  the calibrated device (finite, of the device's 256 values, differing between two draws of the
  same phantom's system), the homogeneous part cancelled (the difference of an empty phantom is
  the noise alone)."""
  import jax

  from cdeit_jax.common import sharding as shd
  from cdeit_jax.data import synthetic

  root = calibrated[0]
  cfg = config_lib.load(f"{REPO / 'configs' / 'device.py'}:{root / 'device.npz'}")
  gen = synthetic.generator(cfg.simulator)
  assert not gen.nominal and gen.layout.num_values == 256
  keys = jax.random.split(jax.random.key(0), 3)
  systems = gen.systems(keys)
  width = np.rad2deg(2 * np.asarray(systems.half_widths))
  lo, hi = cfg.simulator.system.width_deg
  assert width.shape == (3, 16) and lo * 0.95 - 1e-6 <= width.min() and width.max() <= hi * 1.05
  ys, xs = synthetic.example_arrays(
    cfg.simulator, "train", np.arange(2), shd.make_mesh(jax.devices()[:1])
  )
  assert ys.shape == (2, 256) and np.isfinite(ys).all() and np.abs(ys).max() > 0
  assert xs.shape == (2, 128, 128)


@pytest.mark.slow  # about 4 minutes on 2 cores: calibrate, simulate, fine-tune, reconstruct
def test_make_device_model_then_reconstruct_without_the_device_file(tmp_path):
  """`make device-model`'s three commands for the device (models/cdeit16 fine-tuned 4 steps,
  its log saying so), the device
  file moved away, then `python -m cdeit_jax.reconstruct` of absolute frames in the device's
  units with --reference: images of every frame, in the device's units by default, and the
  frames' own device file read as a frame."""
  from cdeit_jax.eit import simulator

  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True, width_deg=WIDTH)
  sim = simulator.Simulator(layout=layout)
  yy, xx = (np.mgrid[:128, :128] - 63.5) / 64
  xs = np.stack([np.where((xx - c) ** 2 + yy**2 < 0.3**2, 1.0, 0.0) for c in (-0.4, 0.4)])
  frames = np.stack([GAIN * np.asarray(sim.cem.voltages(sim.image_conductivity(x))) for x in xs])
  ref = GAIN * np.asarray(sim.vh, np.float64)
  _device(tmp_path / "ref.mat", layout, ref)
  run = tmp_path / "W"
  # the recipe's own network, from models/cdeit16's weights, for a few steps
  tiny = ["--config.steps=4", "--config.eval_every=4", "--config.log_every=2"]
  device = f"configs/device.py:{run / 'device.npz'}"
  for args in (
    [
      "-m",
      "cdeit_jax.calibrate",
      f"--device={tmp_path / 'ref.mat'}",
      f"--out={run / 'device.npz'}",
      "--noelectrodes",
    ],
    ["-m", "cdeit_jax.simulate", f"--config={device}", f"--out={run / 'data'}", "--num_train=32"]
    + ["--num_valid=8", "--num_test=8", "--tr_splits=test"],
    ["train.py", f"--config={device}", f"--workdir={run}", f"--config.data.path={run / 'data'}"]
    + tiny,
  ):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
  assert "models/cdeit16/checkpoints/4000 (a model of CDEIT's EIM" in p.stderr, p.stderr[-3000:]
  assert "leave out the 64 of 256 values measured on current-carrying" in p.stderr
  (tmp_path / "ref.mat").rename(tmp_path / "moved.mat")
  (run / "device.npz").rename(tmp_path / "moved.npz")
  np.save(tmp_path / "frames.npy", frames)
  np.save(tmp_path / "ref.npy", ref)
  out = tmp_path / "out"
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.reconstruct", f"--workdir={run}"]
    + [f"--frames={tmp_path / 'frames.npy'}", f"--reference={tmp_path / 'ref.npy'}"]
    + [f"--out={out}", "--config.sampling.num_samples=1", "--figures=false"],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  z = np.load(out / "frames.npz")
  assert z["images"].shape == (2, 128, 128) and np.isfinite(z["images"]).all()
  info = json.loads(str(z["info"]))
  assert info["units"].endswith(", calibrated") and info["voltage_ratio"] == pytest.approx(
    GAIN, rel=0.01
  )
  # the same frames given as the device's own file (its one frame), minus the same reference
  _device(tmp_path / "frame1.mat", layout, frames[1])
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.reconstruct", f"--workdir={run}"]
    + [f"--frames={tmp_path / 'frame1.mat'}", f"--reference={tmp_path / 'ref.npy'}"]
    + [f"--out={tmp_path / 'one'}", "--config.sampling.num_samples=1", "--figures=false"],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  from cdeit_jax.infer.reconstructor import Reconstructor

  rec = Reconstructor.from_workdir(str(run), overrides={"sampling.num_samples": 1})
  api = rec.reconstruct(frames=frames[1], reference=ref).images  # frame 1 as row 0
  one = np.load(tmp_path / "one" / "frames.npz")["images"]
  np.testing.assert_allclose(one, api, atol=1e-5)
  # the recipe leaves the values on current-carrying electrodes out: a frame may miss them
  carry = layout.on_current_carrying
  assert np.array_equal(rec.guards.ignored, carry) and carry.sum() == 64
  gaps = rec.reconstruct(frames=np.where(carry, np.nan, frames[1]), reference=ref).images
  np.testing.assert_array_equal(gaps, api)


@pytest.mark.parametrize("holds", ["checkpoints", "metrics.jsonl", "translation+checkpoints"])
def test_make_device_model_refuses_a_run_it_did_not_make_before_any_work(tmp_path, holds):
  """A RUN holding a trained run of anything else (checkpoints/ or metrics.jsonl, and no
  device.npz), or a translated model with another model's checkpoints beside it (an import
  into it), is refused in one line before the calibration writes RUN/device.npz or anything is
  simulated; the RUN is left as it was."""
  run = tmp_path / "RUN"
  run.mkdir()
  if holds == "metrics.jsonl":
    (run / "metrics.jsonl").write_text("")
  else:
    (run / "checkpoints").mkdir()
  if holds.startswith("translation"):
    (run / "translation.npz").write_bytes(b"")
    (run / "device.npz").write_bytes(b"")
  before = sorted(p.name for p in run.iterdir())
  env = dict(
    os.environ, DEVICE=str(PROTOCOLS / "skip1" / "ref.mat"), RUN=str(run), BIN="/nonexistent"
  )
  p = subprocess.run(
    ["bash", "recipes/device_model.sh"], capture_output=True, text=True, cwd=REPO, env=env
  )
  assert p.returncode == 2 and p.stdout.count("\n") == 1, p.stdout + p.stderr
  words = "translated model" if holds.startswith("translation") else "did not make"
  assert p.stdout.startswith(f"make device-model: {run} holds a") and words in p.stdout
  assert sorted(p.name for p in run.iterdir()) == before
