"""The Reconstructor API and `python -m cdeit_jax.reconstruct`: eval.py's predictions for the same
voltages, frames files in every format with and without a reference frame, bucketed compilation,
bad frames files named by file and row."""

import os
import pathlib
import subprocess
import sys

import hdf5storage
import mat73
import numpy as np
import pytest
import scipy.io

from cdeit_jax import config_lib, eit, sequence
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import npz_files
from cdeit_jax.eit import measurement
from cdeit_jax.eit.layout import preset
from cdeit_jax.infer import data_kinds, frames, outputs, sampling
from cdeit_jax.infer.reconstructor import Reconstructor

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

REPO = pathlib.Path(__file__).parent.parent
UEF = REPO / "data" / "uef2017"
SETTINGS = {"sampling.seed": 3, "sampling.num_samples": 2}


@pytest.fixture(scope="module")
def uef_ys():
  """The first 6 UEF2017 cases' voltages (device units), in eval.py's file order."""
  names = npz_files.list_files(str(UEF))[:6]
  return np.stack([np.load(UEF / n)["ys"].reshape(-1) for n in names])


@pytest.fixture(scope="module")
def evaluated(tiny_run, uef_ys, tmp_path_factory):
  """eval.py's predictions of those 6 cases (8 devices, 2 samples)."""
  out = tmp_path_factory.mktemp("eval")
  data_kinds.evaluate(
    tiny_run,
    "uef2017",
    str(UEF),
    str(out),
    {**SETTINGS, "eval.figure": False, "eval.max_examples": 6},
  )
  z = np.load(out / "predictions.npz")
  return z["pred"][..., 0], z["std"][..., 0]


@pytest.fixture(scope="module")
def rec(tiny_run):
  return Reconstructor.from_workdir(tiny_run, units="uef2017", overrides=SETTINGS)


def test_api_gives_eval_predictions_with_and_without_a_reference(rec, uef_ys, evaluated):
  pred, std = evaluated
  r = rec.reconstruct(uef_ys)
  assert r.images.shape == (6, 128, 128) and r.std.shape == (6, 128, 128)
  np.testing.assert_allclose(r.images, pred, atol=1e-6, rtol=0)
  np.testing.assert_allclose(r.std, std, atol=1e-6, rtol=0)
  assert r.images.std() > 1e-3  # not a trivially equal pair of zeros
  # time-difference: absolute frames and a reference frame in the device's units
  reference = np.random.default_rng(0).uniform(0.5, 2.0, 208)
  r = rec.reconstruct(frames=uef_ys + reference, reference=reference)
  np.testing.assert_allclose(r.images, pred, atol=1e-6, rtol=0)
  # a frame's reconstruction does not depend on the batch it is in (row i is example i)
  one = rec.reconstruct(uef_ys[4], first_index=4, num_samples=2)
  np.testing.assert_allclose(one.images[0], pred[4], atol=1e-6, rtol=0)


def test_symmetric_samples_are_the_turned_tanks_samples_turned_back(tiny_run, rec, uef_ys):
  """`sampling.symmetric`: sample k (of 8) of a frame is, computed a second way on the host, the
  plain sampler's sample k of the frame's voltages permuted for the k-th symmetry (conditioned
  afresh) with its image turned back; sample 0 (the identity) is the plain sample."""
  from cdeit_jax.eit import symmetry

  sym = Reconstructor.from_workdir(
    tiny_run, units="uef2017", overrides={**SETTINGS, "sampling.symmetric": True}
  )
  got = sym.reconstruct(uef_ys[:2], num_samples=8, keep_samples=True).samples
  index = np.arange(2, dtype=np.int32)
  for k, g in enumerate(symmetry.GROUP):
    cond = rec.condition(uef_ys[:2][:, symmetry.permutation(*g, CDEIT16)])
    want = symmetry.image_back(rec.sampler.sample_rows(cond, index, np.full(2, k, np.int32)), *g)
    np.testing.assert_allclose(got[k], want[..., 0], atol=2e-5, rtol=0)
    if k:  # a turned tank's sample is not the plain one
      plain = rec.sampler.sample_rows(rec.condition(uef_ys[:2]), index, np.full(2, k, np.int32))
      assert np.abs(plain[..., 0] - got[k]).max() > 1e-2


def test_a_stream_of_varying_batches_compiles_each_bucket_once(tiny_run, uef_ys, monkeypatch):
  """8 devices: buckets 8, 16, 32, 64 (the largest, compiled when the API is built); batches of
  1, 3, 8, 5, 17, 2, 30 frames pad to 8 or 32, each compiled once."""
  compiled = []
  real = sampling.compile_batch
  monkeypatch.setattr(
    sampling, "compile_batch", lambda *a, **k: compiled.append(a[3]) or real(*a, **k)
  )
  r = Reconstructor.from_workdir(tiny_run, units="uef2017", overrides={"sampling.num_samples": 1})
  assert r.sampler.buckets == [8, 16, 32, 64] and compiled == [64]
  dv = np.concatenate([uef_ys] * 6)
  at = 0
  out = []
  for n in (1, 3, 8, 5, 17, 2):
    out.append(r.reconstruct(dv[at : at + n], first_index=at).images)
    at += n
  assert sorted(compiled) == [8, 32, 64] and r.sampler.compiled_buckets == [8, 32, 64]
  whole = r.reconstruct(dv[:at]).images  # one batch of 36 -> 64: same images
  np.testing.assert_allclose(np.concatenate(out), whole, atol=1e-6, rtol=0)
  assert sorted(compiled) == [8, 32, 64]


def _write(path: pathlib.Path, frames_: np.ndarray, reference=None) -> str:
  if path.suffix == ".npy":
    np.save(path, frames_)
  elif path.suffix == ".mat":  # EIDORS keeps frames as columns
    scipy.io.savemat(
      path,
      {"vv": frames_.T} if reference is None else {"frames": frames_.T, "reference": reference},
    )
  elif path.suffix == ".csv":
    header = ",".join(f"m{i}" for i in range(frames_.shape[1]))
    np.savetxt(path, frames_, delimiter=",", header=header, comments="")
  return str(path)


def test_frames_files_read_alike(tmp_path, uef_ys):
  """.npy, .npz, .mat (columns) and .csv (with a header) give the same frames; the reference
  frame is read from the file."""
  ref = np.linspace(1, 2, 208)
  for suffix in (".npy", ".mat", ".csv"):
    v, r, t = frames.read(_write(tmp_path / f"f{suffix}", uef_ys))
    np.testing.assert_allclose(v, uef_ys, rtol=1e-15 if suffix != ".csv" else 1e-9)
    assert r is None and t is None
  v, r, _ = frames.read(_write(tmp_path / "g.mat", uef_ys, ref))
  np.testing.assert_allclose(r, ref)
  np.savez(tmp_path / "h.npz", frames=uef_ys, reference=ref)
  v, r, _ = frames.read(str(tmp_path / "h.npz"))
  np.testing.assert_array_equal(v, uef_ys)
  np.testing.assert_array_equal(r, ref)


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "cdeit_jax.reconstruct", *map(str, args)],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=dict(os.environ),
  )


@pytest.mark.e2e
def test_command_gives_eval_predictions_from_every_format(tiny_run, uef_ys, evaluated, tmp_path):
  """A .mat of frames with the file's reference frame, a .csv of difference voltages, a .npy
  of frames with --reference and a v7.3 .mat read 4 frames at a time (K = 2, the seed of
  eval.py): frames.npz `images` and `std` are
  eval.py's `pred` and `std`; the outputs are all written, the .mat in the device's
  conductivity units."""
  pred, std = evaluated
  reference = np.random.default_rng(1).uniform(0.5, 2.0, 208)
  mat = _write(tmp_path / "f.mat", uef_ys + reference, reference)
  csv = _write(tmp_path / "f.csv", uef_ys)
  npy = _write(tmp_path / "f.npy", uef_ys + reference)
  ref = _write(tmp_path / "ref.npy", reference)
  flags = [
    "--workdir",
    tiny_run,
    "--units",
    "uef2017",
    "--config.sampling.seed=3",
    "--config.sampling.num_samples=2",
  ]
  v73 = str(tmp_path / "v73.mat")  # MATLAB v7.3, read a block (--chunk) at a time
  hdf5storage.savemat(v73, {"frames": uef_ys + reference, "reference": reference}, format="7.3")
  # eval.py's ratio settings are honoured as reconstruct's own: uef2017's units, given as ratios
  ratios = ["--config.eval.voltage_ratio=1040.856", "--config.eval.current_ratio=2"]
  for name, args in (
    ("mat", [mat]),
    ("csv", [csv]),
    ("npy", [npy, "--reference", ref]),
    ("v73", [v73, "--chunk", "4"]),
    ("ratios", [csv, *ratios]),
  ):
    given = [f for f in flags if f not in ("--units", "uef2017")] if name == "ratios" else flags
    r = _cli(*given, "--frames", *args, "--out", str(tmp_path / name))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reconstructed 6 frames (2 samples each" in r.stdout and "frames/s" in r.stdout
    z = np.load(tmp_path / name / "frames.npz")
    np.testing.assert_allclose(z["images"], pred, atol=1e-6, rtol=0)
    np.testing.assert_allclose(z["std"], std, atol=1e-6, rtol=0)
    assert sorted(os.listdir(tmp_path / name)) == sorted([*frames.OUTPUTS, outputs.MANIFEST])
  m = mat73.loadmat(tmp_path / "mat" / "frames.mat")  # MATLAB v7.3: a second reader
  np.testing.assert_allclose(m["images"], pred * 2 / 1040.856, rtol=1e-5, atol=1e-9)


def test_bad_frames_are_named_by_file_and_row(rec, uef_ys, tmp_path):
  bad = tmp_path / "bad.csv"
  np.savetxt(bad, uef_ys[:, :207], delimiter=",")
  with pytest.raises(
    InputError,
    match=r"bad.csv: frames must be rows of 208 voltages .* got "
    r"shape \(6, 207\)",
  ):
    frames.read(str(bad))
  np.save(tmp_path / "empty.npy", np.zeros((0, 208)))
  with pytest.raises(InputError, match="empty.npy: no frames"):
    frames.read(str(tmp_path / "empty.npy"))
  (tmp_path / "text.npz").write_text("not a zip")
  with pytest.raises(InputError, match="text.npz: not a readable .npz"):
    frames.read(str(tmp_path / "text.npz"))
  (tmp_path / "words.csv").write_text("a,b\n1,x\n")
  with pytest.raises(InputError, match="words.csv: not a table of numbers"):
    frames.read(str(tmp_path / "words.csv"))
  with pytest.raises(
    InputError, match="f.dat: a frames file is a .npy or .npz or .mat or .csv or .txt file"
  ):
    frames.read(str(tmp_path / "f.dat"))
  nan = uef_ys.copy()
  nan[[1, 4], 7] = np.nan
  nan[4, 9] = np.inf
  with pytest.raises(InputError, match=r"F: rows 1, 4 hold NaN, infinite or out-of-range"):
    rec.guards.check_frames(nan, "F")
  np.testing.assert_array_equal(rec.guards.check_frames(nan, "F", skip_bad=True), [0, 2, 3, 5])
  # differences in other units than the preset's (1000 times too large), and a constant offset
  with pytest.raises(InputError, match=r"F: rows 0, 1, 2, 3, 4, 5 are ~.* standard deviations"):
    rec.guards.check_frames(uef_ys * 1e5, "F")
  with pytest.raises(
    InputError,
    match=r"F: rows 0, 1, 2, 3, 4, 5 are absolute voltages .* or "
    "carry a constant offset",
  ):
    rec.guards.check_frames(uef_ys / 1040.856 + 5.0, "F")
  # far too small: simulation units given as the device's (the ratio applied twice); a frame
  # equal to its reference (zero) and a device's noise alone (0.3 % of the spread) pass
  small = r"^F: its frames are typically ~0.000[1-9]\d* of the training"
  with pytest.raises(InputError, match=small):
    rec.guards.check_frames(uef_ys / 1040.856, "F")
  std_rms = np.sqrt(np.mean(np.ravel(rec.std) ** 2)) * 1040.856
  noise = np.random.default_rng(0).standard_normal((4, 208)) * 0.003 * std_rms
  np.testing.assert_array_equal(
    rec.guards.check_frames(np.vstack([uef_ys, 0 * uef_ys[:1]]), "F"), range(7)
  )
  np.testing.assert_array_equal(rec.guards.check_frames(noise, "F"), range(4))
  with pytest.raises(InputError, match="reference frame holds NaN"):
    rec.guards.difference(frames=uef_ys, reference=np.full(208, np.nan))


def _ktc_208(uel) -> np.ndarray:
  """KTC2023's 2,356 voltages (76 patterns x 31 adjacent differences over 32 electrodes) reduced
  to CDEIT's 208 (docs/reference/eit-conventions.md): the first 16 patterns, the potentials of
  the 16 injecting electrodes, KTC's counter-clockwise numbering reflected, adjacent pairs that
  touch no injecting electrode."""
  from cdeit_jax.eit import layout

  pairs = layout.preset("cdeit16").rows[:, 1].reshape(16, 13)
  d = np.asarray(uel, np.float64).reshape(76, 31)[:16]
  out = np.zeros((16, 13))
  for k in range(16):
    u = np.concatenate([[0.0], -np.cumsum(d[(15 - k) % 16])])  # U_0..U_31 from U_m - U_m+1
    u16 = np.array([u[2 * ((16 - j) % 16)] for j in range(16)])
    m = pairs[k]
    out[k] = u16[m] - u16[(m + 1) % 16]
  return out.ravel()


def test_a_recording_checked_a_block_at_a_time_names_its_rows(rec, uef_ys, tmp_path):
  """`check_recording` in blocks of 2 frames: the rows that can be imaged are those of one
  check of the whole (a block whose every row is skipped included); every refused row is named
  by its row in the file, whichever block it is in, in one line; the units are judged on the
  whole recording, so a quiet last frame (too small on its own) passes with the rest."""
  nan = uef_ys.copy()
  nan[[1, 4, 5], 7] = np.nan
  np.save(tmp_path / "nan.npy", nan)
  whole = rec.guards.check_frames(rec.guards.difference(nan), "F", skip_bad=True)
  with frames.Recording(str(tmp_path / "nan.npy")) as r:
    np.testing.assert_array_equal(rec.guards.check_recording(r, None, "F", True, block=2), whole)
    np.testing.assert_array_equal(whole, [0, 2, 3])
    with pytest.raises(InputError, match=r"F: rows 1, 4, 5 hold NaN") as e:
      rec.guards.check_recording(r, None, "F", block=2)
    assert "\n" not in str(e.value)
  quiet = np.vstack([uef_ys, 1e-6 * uef_ys[:1]])  # a last frame with next to no change
  with pytest.raises(InputError, match="far too small"):
    rec.guards.check_frames(quiet[-1:], "F")  # alone, as one sampler call would have judged it
  np.save(tmp_path / "quiet.npy", quiet)
  with frames.Recording(str(tmp_path / "quiet.npy")) as r:
    np.testing.assert_array_equal(
      rec.guards.check_recording(r, None, "F", block=2), range(len(quiet))
    )
  # the reconstruct command's last sampler call, of that frame alone: not judged again
  assert np.isfinite(rec.reconstruct(quiet[-1:], checked=True).images).all()
  absolute = uef_ys.copy()
  absolute[5] = absolute[5] + 100 * rec.voltage_ratio * rec.guards.vh  # the empty tank's pattern
  np.save(tmp_path / "abs.npy", absolute)
  with frames.Recording(str(tmp_path / "abs.npy")) as r:
    with pytest.raises(InputError, match=r"F: rows 5 are absolute voltages"):
      rec.guards.check_recording(r, None, "F", block=2)


def test_absolute_frames_are_told_from_difference_frames(rec, uef_ys, tmp_path):
  """Real absolute frames (KTC2023's empty tank and its four targets), simulated absolute ones
  at gains 0.3-3 (the empty tank plus UEF2017's differences) and differences with a constant
  offset are refused; real difference frames of both tanks pass; the reference frame's
  subtraction turns the refused frames into ones that pass (and into the difference frames'
  images). The command says it in one line."""
  import scipy.io

  from cdeit_jax.infer.frame_guards import absolute_rows

  ktc = REPO / "data" / "ktc2023" / "levels" / "level_1"
  ref = _ktc_208(scipy.io.loadmat(ktc / "ref.mat")["Uelref"])
  tanks = np.stack([_ktc_208(scipy.io.loadmat(ktc / f"data{i}.mat")["Uel"]) for i in range(1, 5)])
  vh = rec.guards.vh
  # oriented as CDEIT's order: the empty tank points along the simulated one (not against it)
  assert ref @ vh / (np.linalg.norm(ref) * np.linalg.norm(vh)) > 0.9
  assert absolute_rows(np.vstack([ref, tanks]) / 1978.0, vh).all()
  assert not absolute_rows((tanks - ref) / 1978.0, vh).any()
  dv = uef_ys / 1040.856
  assert not absolute_rows(dv, vh).any()
  for gain in (0.3, 1.0, 3.0):
    assert absolute_rows(gain * (vh + dv), vh).all(), gain
  for offset in (0.1, 0.7):  # volts, on the tank's differences
    assert absolute_rows((uef_ys + offset) / 1040.856, vh).all(), offset
  empty = 1040.856 * vh  # the empty tank in UEF2017's units
  with pytest.raises(InputError, match=r"rows 0, 1, 2, 3, 4, 5 are absolute voltages"):
    rec.reconstruct(frames=uef_ys + empty)
  with_ref = rec.reconstruct(frames=uef_ys + empty, reference=empty)
  np.testing.assert_allclose(with_ref.images, rec.reconstruct(uef_ys).images, atol=1e-6, rtol=0)
  np.save(tmp_path / "absolute.npy", uef_ys + empty)
  r = _cli(
    "--workdir",
    rec.checkpoint,
    "--frames",
    str(tmp_path / "absolute.npy"),
    "--out",
    str(tmp_path / "out"),
    "--units",
    "uef2017",
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.count("error:") == 1 and "are absolute voltages" in r.stderr
  assert "give the empty-tank frame as the reference" in r.stderr
  assert not (tmp_path / "out").exists()  # a refusal leaves no empty --out behind


def test_the_checkpoints_statistics_unless_eval_stats_names_others(tiny_run, rec, uef_ys, tmp_path):
  """The Reconstructor standardises with the checkpoint's statistics; --config.eval.stats (the
  API's overrides, reconstruct's flag) names others, which change the images."""
  from cdeit_jax.data import stats

  mean, std = stats.authors_stats()
  assert rec.statistics.source == "checkpoint"
  np.testing.assert_array_equal(rec.mean, mean)
  np.save(tmp_path / "mean.npy", mean * 0.5)
  np.save(tmp_path / "std.npy", std * 3.0)
  other = Reconstructor.from_workdir(
    tiny_run, units="uef2017", overrides={**SETTINGS, "eval.stats": str(tmp_path)}
  )
  assert other.statistics.source == str(tmp_path)
  np.testing.assert_array_equal(other.std, std * 3.0)
  assert not np.allclose(other.reconstruct(uef_ys).images, rec.reconstruct(uef_ys).images)


def test_frames_are_checked_against_their_reference_on_the_models_own_path(rec, uef_ys):
  """On the model's own path (`FrameGuards.difference`) absolute frames are checked against the
  reference they are differenced with: KTC2023's four real targets (level 1, reduced to CDEIT's
  208) with their own empty tank, and UEF2017's differences on the empty tank, pass; the same
  frames negated, in millivolts against a reference in volts, or given as differences with a
  reference are refused in one line naming the rows, the reference and --reference; the rows
  of a block are counted from its first (`first_row`)."""
  import scipy.io

  ktc = REPO / "data" / "ktc2023" / "levels" / "level_1"
  ref = _ktc_208(scipy.io.loadmat(ktc / "ref.mat")["Uelref"])
  tanks = np.stack([_ktc_208(scipy.io.loadmat(ktc / f"data{i}.mat")["Uel"]) for i in range(1, 5)])
  empty = 1040.856 * rec.guards.vh
  diff = lambda f, r, **kw: rec.guards.difference(frames=f, reference=r, where="F", **kw)
  np.testing.assert_allclose(diff(tanks, ref), (tanks - ref).astype(np.float32))
  diff(uef_ys + empty, empty)
  for f, r, words in (
    (
      -tanks,
      ref,
      r"F: rows 0, 1, 2, 3 are the reference frame \(F: the reference frame\) "
      r"negated \(cosine -0\.99",
    ),
    (1e3 * tanks, ref, r"F: rows 0, 1, 2, 3 are 1\.\d+e\+03 times the reference frame"),
    (uef_ys, empty, r"F: rows 0, .* differ from .*difference voltages already"),
  ):
    with pytest.raises(InputError, match=words) as e:
      diff(f, r)
    assert "--reference REF or --reference_row N" in str(e.value) and "\n" not in str(e.value)
  mixed = tanks.copy()
  mixed[2] *= -1
  with pytest.raises(InputError, match=r"F: rows 4098 are the reference frame"):
    diff(mixed, ref, first_row=4096)
  # eval.py's KTC2023 challenge reads values, not reconstruct's flags: its refusals say so
  from cdeit_jax.infer import challenge

  with pytest.raises(InputError, match=r"levels: rows 0, .* are absolute voltages") as e:
    rec.reconstruct_values((uef_ys + empty) / 1040.856, where="levels", hints=challenge.HINTS)
  assert "its level's ref.mat" in str(e.value) and "--reference" not in str(e.value)


def test_a_reference_of_the_other_sign_is_refused_and_negate_reads_it(rec, uef_ys, tmp_path):
  """A device that measures with the other sign (the empty tank's values negative, as
  UEF2017's raw files are before the authors' conversion): its reference is refused in one line
  that names the sign and --negate, real (KTC2023's empty tank) and simulated alike; with
  --negate the frames and the reference read as the model's sign image as the plain ones do."""
  import scipy.io

  empty = 1040.856 * rec.guards.vh  # the empty tank in UEF2017's units
  for ref in (
    -empty,
    -_ktc_208(scipy.io.loadmat(REPO / "data/ktc2023/levels/level_1/ref.mat")["Uelref"]),
  ):
    with pytest.raises(InputError, match=r"negated \(cosine -0\.9\d|negated \(cosine -1\.00"):
      rec.reconstruct(frames=uef_ys * 0 + ref, reference=ref)
  assert rec.reconstruct(frames=uef_ys + empty, reference=empty).images.shape[0] == 6  # passes
  np.save(tmp_path / "f.npy", -(uef_ys + empty))
  np.save(tmp_path / "ref.npy", -empty)
  with frames.Recording(str(tmp_path / "f.npy"), negate=True) as r:
    np.testing.assert_allclose(r.rows(0, 6), uef_ys + empty, rtol=1e-15)
  flags = ["--workdir", rec.checkpoint, "--frames", tmp_path / "f.npy", "--reference"]
  flags += [tmp_path / "ref.npy", "--units", "uef2017", "--config.sampling.seed=3"]
  flags += ["--config.sampling.num_samples=2", "--nofigures"]
  r = _cli(*flags, "--out", tmp_path / "refused")
  assert r.returncode == 1 and r.stderr.count("error:") == 1, r.stderr[-2000:]
  assert "negated" in r.stderr and "--negate" in r.stderr and "Traceback" not in r.stderr
  r = _cli(*flags, "--negate", "--out", tmp_path / "out")
  assert r.returncode == 0, r.stderr[-2000:]
  z = np.load(tmp_path / "out" / "frames.npz")
  np.testing.assert_allclose(z["images"], rec.reconstruct(uef_ys).images, atol=1e-5, rtol=0)
  assert '"negated": true' in str(z["info"])


def test_the_absolute_guard_allows_for_the_models_drift():
  """A model trained with the background drifting by up to 10 % (configs/ktc2023_model_drift.py,
  stage two of models/ktc2023: `simulator.system.drift=(0.9, 1.1)`) reads UEF2017's 22
  difference frames drifted by 0.9 at its largest gain / background (1.1 / 0.9): the guard of a
  model without drift (stage one, configs/ktc2023_model.py) refuses 5 of them, the drift's
  allowance none, and it still refuses absolute frames at gains 0.5-3."""
  from cdeit_jax.infer.frame_guards import absolute_rows, drift_allowance

  assert drift_allowance(config_lib.load(str(REPO / "configs" / "ktc2023_model.py"))) == 0.0
  cfg = config_lib.load(str(REPO / "configs" / "ktc2023_model_drift.py"))
  assert drift_allowance(cfg) == pytest.approx(0.1)
  names = npz_files.list_files(str(UEF))
  dv = np.stack([np.load(UEF / n)["ys"].reshape(-1) for n in names]) / 1040.856
  vh = np.asarray(eit.default_simulator(CDEIT16).vh, np.float64)
  drifted = 1.1 / 0.9 * (0.9 * (vh + dv) - vh)
  assert absolute_rows(drifted, vh).sum() == 5
  assert not absolute_rows(drifted, vh, 0.1).any()
  for gain in (0.5, 1.0, 3.0):
    assert absolute_rows(gain * (vh + dv), vh, 0.1).all(), gain


def test_counts_indices_ratios_and_paths_are_checked_in_one_line(rec, uef_ys, tmp_path):
  """Sample counts, first indices and unit ratios out of range, a folder or a ';'-separated CSV
  as the frames file, and an --out inside the run's checkpoints: each one InputError naming the
  value (no silent default, truncation, wrap-around or sign flip)."""
  from cdeit_jax.eit import measurement

  for k in (0, 2.7, 10**6, True):
    with pytest.raises(InputError, match=f"num_samples={k!r}: must be an integer from 1"):
      rec.reconstruct(uef_ys[:1], num_samples=k)
  with pytest.raises(InputError, match=r"first_index=2147483648: must be an integer from 0"):
    rec.reconstruct(uef_ys[:1], first_index=2**31)
  for bad in (0.0, -2.0, float("nan"), float("inf")):
    with pytest.raises(InputError, match="voltage_ratio=.*: must be a positive number"):
      measurement.resolve_ratios("uef2017", voltage_ratio=bad)
  with pytest.raises(InputError, match=f"{tmp_path}: a folder; a frames file is a .npy or"):
    frames.read(str(tmp_path))
  semicolons = tmp_path / "semi.csv"
  semicolons.write_text(";".join(f"{v:.3e}".replace(".", ",") for v in uef_ys[0]) + "\n")
  with pytest.raises(InputError, match=r"semi.csv: decimal commas .* with a '.' decimal point"):
    frames.read(str(semicolons))
  huge = uef_ys[:2].astype(np.float64)
  huge[1, 5] = 1e300  # finite, but beyond float32
  with pytest.raises(
    InputError, match=r"rows 1 hold NaN, infinite or out-of-range \(beyond float32"
  ):
    rec.guards.check_frames(rec.guards.difference(huge), "F")
  np.save(tmp_path / "f.npy", uef_ys)
  inside = pathlib.Path(rec.checkpoint) / "images"
  r = _cli(
    "--workdir",
    rec.checkpoint,
    "--frames",
    str(tmp_path / "f.npy"),
    "--out",
    str(inside),
    "--units",
    "uef2017",
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "lies inside the run's checkpoints" in r.stderr and not inside.exists()


@pytest.mark.e2e
def test_command_skips_and_lists_nan_frames_or_refuses_in_one_line(tiny_run, uef_ys, tmp_path):
  nan = uef_ys.copy()
  nan[2, 0] = np.nan
  path = _write(tmp_path / "nan.npy", nan)
  flags = ["--workdir", tiny_run, "--units", "uef2017", "--frames", path, "--figures=false"]
  r = _cli(*flags, "--out", str(tmp_path / "o"))
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert f"error: {path}: rows 2 hold NaN, infinite or out-of-range" in r.stderr
  r = _cli(*flags, "--out", str(tmp_path / "o"), "--config.wandb.project=x")  # eval.py's, not ours
  assert r.returncode == 1 and "--config.wandb.project: reconstruct logs nothing" in r.stderr
  r = _cli(*flags, "--out", str(tmp_path / "o"), "--config.eval.tikhonov=True")
  assert r.returncode == 1 and "--config.eval.tikhonov: reconstruct does not use it" in r.stderr
  columns = _write(tmp_path / "eidors.npy", uef_ys[np.arange(208) % len(uef_ys)].T)  # (R, N)
  eidors = [f if f != path else columns for f in flags]
  r = _cli(*eidors, "--out", str(tmp_path / "e"))  # 208 frames as columns: square, read as rows
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "is a square 208 x 208 array, read as one frame a row; if its frames are its columns" in (
    r.stderr
  )
  offset = np.random.default_rng(1).uniform(0.5, 2.0, 208)  # absolute frames, as columns
  absolute = _write(tmp_path / "abs.npy", (uef_ys[np.arange(208) % len(uef_ys)] + offset).T)
  r = _cli(*[f if f != path else absolute for f in flags], "--out", str(tmp_path / "a"))
  errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
  assert r.returncode == 1 and len(errors) == 1, r.stderr[-2000:]
  assert "Note: " in errors[0] and "is a square 208 x 208 array" in errors[0]
  r = _cli(*flags, "--out", str(tmp_path / "o"), "--fps=0.001", "--figures")  # before sampling
  assert r.returncode == 1 and "--fps=0.001: a GIF shows 0.00153 to 100 frames a second" in r.stderr
  both = ["--voltage_ratio=2", "--config.eval.voltage_ratio=3"]
  r = _cli(*flags, "--out", str(tmp_path / "o"), *both)
  assert r.returncode == 1 and "--voltage_ratio=2 and --config.eval.voltage_ratio=3 disagree" in (
    r.stderr
  )
  r = _cli(*flags, "--out", str(tmp_path / "o"), "--skip_bad_frames")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "skipping 1 rows with NaN or infinite voltages (their images are NaN): 2" in r.stderr
  z = np.load(tmp_path / "o" / "frames.npz")
  assert np.isnan(z["images"][2]).all() and np.isfinite(z["images"][[0, 1, 3, 4, 5]]).all()
  assert z["skipped"].tolist() == [2]


def test_frames_writer_lists_frames_whose_images_are_not_finite(tmp_path):
  """Rows skipped for their voltages and rows whose images came out NaN or infinite are both
  listed in `skipped` of frames.npz and frames.mat (there counted from 1, as MATLAB counts, its
  `rows` too); the images and std read back as written."""
  import mat73

  rng = np.random.default_rng(0)
  images = rng.standard_normal((5, 8, 8)).astype(np.float32)
  std = np.abs(images)
  images[3, 2, 2] = np.nan  # the model gave a NaN image for frame 3
  w = frames.FramesWriter(str(tmp_path), 6, 8, True, np.array([1]), 2.0)
  w.add(0, images[:1], std[:1])
  w.add(2, images[1:], std[1:])
  names = w.finish({"k": 1}, fps=10.0, figures=False, targets=None)
  assert names == ["frames.mat", "frames.npz"] and w.nonfinite == [4]
  z = np.load(tmp_path / "frames.npz")
  np.testing.assert_array_equal(z["skipped"], [1, 4])
  np.testing.assert_array_equal(z["images"][[0, 2, 3, 4, 5]], images)
  np.testing.assert_array_equal(z["std"][[0, 2, 3, 4, 5]], std)
  assert np.isnan(z["images"][1]).all()
  m = mat73.loadmat(tmp_path / "frames.mat")
  np.testing.assert_array_equal(m["skipped"].ravel(), [2, 5])  # MATLAB's row numbers
  np.testing.assert_array_equal(m["rows"].ravel(), np.arange(1, 7))
  np.testing.assert_array_equal(z["rows"], np.arange(6))
  np.testing.assert_allclose(m["images"][[0, 2]], images[:2] * 2.0)
  assert np.isnan(m["images"][1]).all() and m["images"].shape == (6, 8, 8)


@pytest.mark.e2e
def test_moving_sequence_is_the_simulators_voltages_of_its_phantoms():
  """The demo sequence: frames minus the reference are the simulator's difference voltages of
  the same phantoms (noise-free), the true images are those phantoms rendered."""
  import jax

  from cdeit_jax import eit
  from cdeit_jax.eit import phantom as ph

  seq = sequence.simulate(16, snr_db=None)
  params = sequence.phantoms(16)
  sim = eit.default_simulator(CDEIT16)
  dv = np.asarray(sim.phantom_voltages(params))
  np.testing.assert_allclose(seq["frames"] - seq["reference"], dv, atol=1e-6 * np.abs(dv).max())
  assert np.abs(dv).max() > 1e-5
  np.testing.assert_allclose(seq["targets"], np.asarray(jax.vmap(ph.render_image)(params)))
  # the lungs are empty at frame 0 and full half a breath later; the disc moves along the wall
  assert seq["targets"][0].min() == 0 and seq["targets"][0].max() > 0.7
  assert np.isclose(params[0, 0, 7], 0) and np.isclose(
    params[sequence.BREATH // 2, 0, 7], sequence.LUNG
  )
  radius = np.hypot(params[:8, 2, 2], params[:8, 2, 3])
  np.testing.assert_allclose(radius, 0.78)
  assert measurement.NUM_MEASUREMENTS == seq["frames"].shape[1]


def test_a_model_of_another_system_has_the_same_guards_everywhere(device_run, tmp_path):
  """A model of a 16-electrode skip-2 device (`device_run`): `reconstruct` in the device's
  units (gain 500) and `reconstruct_values` in the simulator's give the same images, also
  without electrode 3; both refuse values in other units, absolute frames, infinite values and
  NaN that is none of the model's removal sets, one line each; the command images the device's
  frames of 256 values with a reference frame as the API does, and names the model's system
  when given 208 values."""
  from conftest import device_volts, disc

  d = device_run
  rec = Reconstructor.from_workdir(
    d.run, voltage_ratio=500.0, current_ratio=2.0, overrides={"sampling.num_samples": 1}
  )
  ref, target = device_volts(d.layout, disc())
  gone = d.layout.without([3])
  frames_ = np.stack([target, np.where(gone, np.nan, target)])
  a = rec.reconstruct(frames=frames_, reference=ref)
  b = rec.reconstruct_values((frames_ - ref) / 500.0)
  np.testing.assert_allclose(a.images, b.images, atol=1e-5, rtol=0)
  assert np.isfinite(a.images).all() and a.images.std() > 1e-4
  inf, other_nan = frames_[:1] - ref, frames_[:1] - ref
  inf[0, 4] = np.inf
  other_nan[0, d.layout.without([5])] = np.nan
  for call, words in (
    (lambda: rec.reconstruct_values(frames_[:1] - ref), "standard deviations .* simulation units"),
    (lambda: rec.reconstruct_values(1e30 * (frames_[:1] - ref)), "standard deviations"),
    (lambda: rec.reconstruct_values(ref[None] / 500.0), "are absolute voltages"),
    (lambda: rec.reconstruct(frames=frames_), "rows 0, 1 are absolute voltages"),
    (lambda: rec.reconstruct_values(inf / 500.0), "rows 0 hold NaN, infinite"),
    (lambda: rec.reconstruct(other_nan), "only as one of the model's 2 electrode-removal sets"),
  ):
    with pytest.raises(InputError, match=words) as e:
      call()
    assert "\n" not in str(e.value)
  np.save(tmp_path / "frames.npy", frames_)
  np.save(tmp_path / "ref.npy", ref)
  units = ["--voltage_ratio=500", "--current_ratio=2", "--config.sampling.num_samples=1"]
  common = ["--workdir", d.run, *units, "--figures=false"]
  r = _cli(
    *common,
    "--frames",
    tmp_path / "frames.npy",
    "--reference",
    tmp_path / "ref.npy",
    "--out",
    tmp_path / "out",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  np.testing.assert_allclose(
    np.load(tmp_path / "out" / "frames.npz")["images"], a.images, atol=1e-5
  )
  np.save(tmp_path / "cdeit16.npy", np.zeros((2, 208)))
  r = _cli(*common, "--frames", tmp_path / "cdeit16.npy", "--out", tmp_path / "no")
  assert r.returncode == 1 and r.stderr.count("error:") == 1, r.stderr[-2000:]
  assert "rows of 256 voltages of device.mat (KTC keys) (16 electrodes" in r.stderr
  assert "(208 values: as cdeit16" in r.stderr and not (tmp_path / "no").exists()
  words = r"uef2017 \(1_1.npz's ys\): frames must be rows of 256 .*\(208 values"
  with pytest.raises(InputError, match=words):
    data_kinds.evaluate(d.run, "uef2017", str(UEF), str(tmp_path / "e"))
