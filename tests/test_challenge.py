"""KTC2023-style folders answered (`cdeit_jax.infer.challenge`, `cdeit_jax.data.ktc2023`, the
linearised answers of `eval.py --data ktc2023_challenge` without a model): the data and a
user's files are never touched, inputs that cannot be a measurement are refused in one line
before --out is made, and a frame stored as one column per pattern gives the same answers. The
device is a 16-electrode skip-2 system in KTC's keys (`conftest.challenge_folder`), so that
every case runs in seconds."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.io
from conftest import REPO, SKIP2, challenge_folder, device_arrays

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as lay
from cdeit_jax.infer import challenge, ktc_score

LEVELS = REPO / "data" / "ktc2023" / "levels"
LAYOUT = lay.from_rules(16, **SKIP2)


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
  """levels/level_1 (every value) and levels/level_2 (electrode 3 removed)."""
  root = tmp_path_factory.mktemp("levels") / "levels"
  challenge_folder(root / "level_1", LAYOUT, [])
  challenge_folder(root / "level_2", LAYOUT, [3])
  return root


def _tree(root) -> dict[str, bytes]:
  out = {}
  for d, _, files in os.walk(root):
    for f in files:
      p = os.path.join(d, f)
      out[os.path.relpath(p, root)] = open(p, "rb").read()
  return out


def _copy(levels, tmp_path, *names) -> str:
  data = tmp_path / "data"
  for name in names:
    shutil.copytree(levels / name, data / name)
  return str(data)


def test_outputs_never_touch_the_data_or_a_users_files(levels, tmp_path):
  """--out as the data's parent or as a link to the data is refused and every data file stays
  byte for byte; a user's file inside OUT/level_1 survives a rerun; a later run over fewer
  levels removes the earlier run's level folder it lacks."""
  data = _copy(levels, tmp_path, "level_1", "level_2")
  before = _tree(data)
  link = tmp_path / "link"
  link.symlink_to(os.path.join(data, "level_1"))
  for path, out, words in (
    (os.path.join(data, "level_1"), data, "contains the data folder"),
    (os.path.join(data, "level_1"), str(link), "is the data folder"),
    (data, os.path.join(data, "level_1"), "lies inside the data folder"),
  ):
    with pytest.raises(InputError, match=words):
      challenge.linear_answers(path, out)
  assert _tree(data) == before
  out = tmp_path / "out"
  r = challenge.linear_answers(data, str(out))
  assert r["targets"] == 2 and sorted(os.listdir(out / "level_2")) == ["1.mat"]
  (out / "level_1" / "notes.txt").write_text("mine")
  challenge.linear_answers(os.path.join(data, "level_1"), str(out))
  assert (out / "level_1" / "notes.txt").read_text() == "mine"
  assert not (out / "level_2").exists()  # the earlier run's level, not this one's
  assert _tree(data) == before


def test_a_missing_truth_is_named_and_the_others_are_scored(levels, tmp_path, caplog):
  """One level's truth file missing: every target is answered, the others scored (the level
  with no truth left out of the table), the missing file named in a warning and in
  metrics.json's `unscored`."""
  data = _copy(levels, tmp_path, "level_1", "level_2")
  os.remove(os.path.join(data, "level_2", "true1.mat"))
  with caplog.at_level(logging.WARNING):
    r = challenge.linear_answers(data, str(tmp_path / "out"))
  missing = os.path.join(data, "level_2", "true1.mat")
  assert r["unscored"] == [missing] and any(missing in m.getMessage() for m in caplog.records)
  assert sorted(os.listdir(tmp_path / "out" / "level_2")) == ["1.mat"]
  full = challenge.linear_answers(_copy(levels, tmp_path / "full", "level_1"), str(tmp_path / "f"))
  for method in ("tikhonov", "water"):
    got = r["metrics"][method]
    assert got["targets"] == 1 and list(got["ktc_score_per_level"]) == ["level_1"]
    assert got["ktc_score"] == pytest.approx(full["metrics"][method]["ktc_score"], abs=1e-12)
  assert "| level 1 (1) | total |" in r["table"] and "level 2" not in r["table"]


def test_a_frame_of_pattern_columns_answers_as_its_column(levels, tmp_path):
  """A target's Uel saved as one column per pattern (16, 16) gives the answer of the same
  values in one column; the calibration is logged."""
  data = _copy(levels, tmp_path, "level_1")
  out_a, out_b = tmp_path / "a", tmp_path / "b"
  challenge.linear_answers(data, str(out_a))
  f = os.path.join(data, "level_1", "data1.mat")
  d = scipy.io.loadmat(f)
  d["Uel"] = d["Uel"].reshape(16, 16).T  # pattern p's values in column p
  scipy.io.savemat(f, {k: v for k, v in d.items() if not k.startswith("__")})
  challenge.linear_answers(data, str(out_b))
  a = scipy.io.loadmat(out_a / "level_1" / "1.mat")
  b = scipy.io.loadmat(out_b / "level_1" / "1.mat")
  np.testing.assert_array_equal(a["reconstruction"], b["reconstruction"])
  np.testing.assert_allclose(a["image"], b["image"], rtol=0, atol=1e-12)


def _edit(folder, name, **arrays):
  path = os.path.join(folder, name)
  d = {k: v for k, v in scipy.io.loadmat(path).items() if not k.startswith("__")}
  scipy.io.savemat(path, {**d, **arrays})


def test_inputs_that_cannot_be_a_measurement_are_refused_before_out(levels, tmp_path):
  """Each in one line naming the file, with no --out made: a negated and a constant empty-tank
  frame, an all-zero one, an all-NaN one (named, not the target beside it), a target of NaN
  only, a target negated or scaled by 1e30 against its reference (named with it, in the
  challenge's words: no reconstruct flags), truths other than 0/1/2, one level or target under
  two names, levels of two measuring systems, and flags out of range."""
  cases = []
  ref = scipy.io.loadmat(levels / "level_1" / "ref.mat")["Uelref"]
  uel = scipy.io.loadmat(levels / "level_1" / "data1.mat")["Uel"]
  ours = r"\(each level's ref.mat and dataN.mat, as the challenge ships them\)$"
  for i, (name, arrays, words) in enumerate(
    (
      ("ref.mat", {"Uelref": -ref}, r"ref.mat: gain -\d+.* the frame's sign is flipped"),
      ("ref.mat", {"Uelref": np.full_like(ref, 0.3)}, r"ref.mat: current pattern 0's .* all 0.3"),
      ("ref.mat", {"Uelref": 0 * ref}, "ref.mat: every value is zero"),
      ("ref.mat", {"Uelref": np.nan * ref}, "level_1/ref.mat: every value of Uelref is NaN"),
      (
        "data1.mat",
        {"Uel": -uel},
        r"data1.mat: its frame is the reference frame \(.*ref.mat\) "
        r"negated \(cosine -1.00\).*" + ours,
      ),
      (
        "data1.mat",
        {"Uel": 1e30 * uel},
        r"data1.mat: its frame is [\d.]+e\+29 times the reference "
        r"frame \(.*ref.mat\): other units.*" + ours,
      ),
      ("data1.mat", {"Uel": np.full_like(ref, np.nan)}, "data1.mat: every value of Uel is NaN"),
      ("true1.mat", {"truth": np.full((256, 256), 7.0)}, r"true1.mat: 'truth' holds .*: 7"),
      ("true1.mat", {"truth": -np.ones((256, 256))}, r"true1.mat: 'truth' holds .*: -1"),
      ("true1.mat", {"truth": np.full((256, 256), np.nan)}, r"true1.mat: .* nan"),
    )
  ):
    data = _copy(levels, tmp_path / f"c{i}", "level_1")
    _edit(os.path.join(data, "level_1"), name, **arrays)
    cases.append((data, words))
  twice = _copy(levels, tmp_path / "twice", "level_1")
  shutil.copytree(os.path.join(twice, "level_1"), os.path.join(twice, "level_01"))
  cases.append((twice, "level_01 and level_1 are both level 1"))
  targets = _copy(levels, tmp_path / "targets", "level_1")
  shutil.copy(
    os.path.join(targets, "level_1", "data1.mat"), os.path.join(targets, "level_1", "data01.mat")
  )
  cases.append((targets, "data01.mat and data1.mat are both target 1"))
  mixed = _copy(levels, tmp_path / "mixed", "level_1")
  other = lay.from_rules(16, injection="skip-3", measure_injecting=True, clockwise=False)
  challenge_folder(tmp_path / "mixed" / "data" / "level_2", other, [])
  cases.append((mixed, "give the levels of one measuring system"))
  for data, words in cases:
    out = tmp_path / "never"
    with pytest.raises(InputError, match=words) as e:
      challenge.linear_answers(data, str(out))
    assert "\n" not in str(e.value) and not out.exists(), words
  data = str(levels)
  alpha, level = "simulator.tikhonov_alpha", "eval.tikhonov_segment_level"
  for overrides, words in (
    ({alpha: float("nan")}, "--config.simulator.tikhonov_alpha=nan: must be a finite number > 0"),
    ({level: float("nan")}, "--config.eval.tikhonov_segment_level=nan: must be between 0 and 1"),
    ({level: -0.5}, "--config.eval.tikhonov_segment_level=-0.5"),
    ({level: 0.0}, "--config.eval.tikhonov_segment_level=0.0"),
    ({level: 1.5}, "--config.eval.tikhonov_segment_level=1.5"),
    ({"eval.no_such_key": 1}, "--config.eval.no_such_key=1: no such key"),
  ):
    with pytest.raises(InputError, match=words):
      challenge.linear_answers(data, str(tmp_path / "never"), overrides)
  assert not (tmp_path / "never").exists()


@pytest.mark.e2e
def test_the_command_says_a_refusal_in_one_line(levels, tmp_path):
  """eval.py --data ktc2023_challenge without a model (the linearised answers): a negated
  reference is one line on stderr, rc 1, no --out; another kind without --workdir is one line
  too."""
  data = _copy(levels, tmp_path, "level_1")
  ref = scipy.io.loadmat(os.path.join(data, "level_1", "ref.mat"))["Uelref"]
  _edit(os.path.join(data, "level_1"), "ref.mat", Uelref=-ref)
  out = tmp_path / "out"
  run = lambda *args: subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=300
  )
  p = run("eval.py", "--data=ktc2023_challenge", f"--data_path={data}", f"--out={out}")
  assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
  assert p.stderr.count("error:") == 1 and "sign is flipped" in p.stderr
  assert not out.exists()
  p = run("eval.py", "--data=uef2017", "--data_path=data/uef2017", f"--out={out}")
  assert p.returncode == 1 and p.stderr.count("error:") == 1, p.stderr[-2000:]
  assert "--data uef2017: give the model to evaluate with --workdir" in p.stderr
  assert not out.exists()


def test_a_models_answers_keep_the_data_and_refuse_what_cannot_be(device_run, levels, tmp_path):
  """eval.py's challenge path (`challenge.evaluate`, a tiny model of the device): --out as the
  data's parent and as a link to the data are refused with every data file byte for byte; a
  user's file in OUT/level_1 is kept; a negated, a constant and a shuffled reference are refused
  in one line with no answers written; a target stored as one column per pattern answers as
  before."""
  common = {"sampling.num_samples": 1, "eval.figure": False}
  data = _copy(levels, tmp_path, "level_1")
  level = os.path.join(data, "level_1")
  before = _tree(data)
  link = tmp_path / "link"
  link.symlink_to(level)
  for out, words in ((data, "contains the data folder"), (str(link), "is the data folder")):
    with pytest.raises(InputError, match=words):
      challenge.evaluate(device_run.run, level, out, common)
  assert _tree(data) == before
  out = tmp_path / "out"
  first = challenge.evaluate(device_run.run, level, str(out), common)
  (out / "level_1" / "notes.txt").write_text("mine")
  answer = scipy.io.loadmat(out / "level_1" / "1.mat")["reconstruction"]
  d = scipy.io.loadmat(os.path.join(level, "data1.mat"))
  _edit(level, "data1.mat", Uel=d["Uel"].reshape(16, 16).T)
  again = challenge.evaluate(device_run.run, level, str(out), common)
  assert (out / "level_1" / "notes.txt").read_text() == "mine"
  np.testing.assert_array_equal(
    scipy.io.loadmat(out / "level_1" / "1.mat")["reconstruction"], answer
  )
  assert again["metrics"]["cdeit"] == first["metrics"]["cdeit"]
  ref = scipy.io.loadmat(os.path.join(level, "ref.mat"))["Uelref"]
  shuffled = np.random.default_rng(0).permutation(ref.ravel()).reshape(ref.shape)
  for bad, words in (
    (-ref, "sign is flipped"),
    (np.full_like(ref, 0.3), "which no empty tank measures"),
    (shuffled, "a residual beyond"),
  ):
    _edit(level, "ref.mat", Uelref=bad)
    with pytest.raises(InputError, match=words) as e:
      challenge.evaluate(device_run.run, level, str(tmp_path / "never"), common)
    assert "\n" not in str(e.value) and not (tmp_path / "never").exists()


@pytest.mark.slow  # the 2,356-row Jacobian: ~45 s; the same command on a 16-electrode device
# runs by default (test_a_skip_2_device_through_the_challenge_command)
def test_challenge_command_writes_answers_that_beat_all_water(tmp_path):
  """eval.py --data ktc2023_challenge without a model on two of the public levels:
  OUT/level_K/N.mat answers of 0/1/2 on the 256 x 256 grid, metrics.json with the challenge
  scores, the linearised reconstruction far ahead of the all-water floor at both levels
  (measured: 3.31 and 2.15 of 4 against 1.06) and images the right way round (a turned answer
  scores less)."""
  data = tmp_path / "levels"
  for k in (1, 7):
    shutil.copytree(LEVELS / f"level_{k}", data / f"level_{k}")
  out = tmp_path / "out"
  p = subprocess.run(
    [sys.executable, "eval.py", "--data=ktc2023_challenge", f"--data_path={data}", f"--out={out}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=600,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert "| tikhonov |" in p.stdout and "| water |" in p.stdout, p.stdout
  r = json.loads((out / "metrics.json").read_text())
  tik, water = r["metrics"]["tikhonov"], r["metrics"]["water"]
  for level in ("level_1", "level_7"):
    assert tik["ktc_score_per_level"][level] > water["ktc_score_per_level"][level] + 0.8
  assert tik["ktc_score_per_level"]["level_1"] > 3.0
  answer = scipy.io.loadmat(out / "level_1" / "1.mat")["reconstruction"]
  assert answer.shape == (256, 256) and set(np.unique(answer)) <= {0, 1, 2}
  truth = scipy.io.loadmat(LEVELS / "level_1" / "true1.mat")["truth"]
  score = ktc_score.score(truth, answer)
  assert score == pytest.approx(tik["ktc_score_per_target"]["level_1/1"])
  assert score > max(ktc_score.score(truth, np.rot90(answer, k)) for k in (1, 2, 3))
  assert score > ktc_score.score(truth, answer[::-1])
  assert not list(out.glob(".staging*"))


@pytest.mark.slow  # 17 s; tests/test_any_system.py runs a skip-2 device through eval.py's
# challenge path by default
def test_a_skip_2_device_through_the_challenge_command(tmp_path):
  """A 16-electrode skip-2 device that measures on its current-carrying electrodes, numbered
  counter-clockwise, with its own units (gain 500): its absolute frames simulated for a
  conductive and a resistive disc, written as the challenge's files (KTC's keys; level 2 with
  electrode 3 removed), go through eval.py without a model: the linearised answers find
  both discs where they are, far ahead of all water, also with the electrode removed."""
  from cdeit_jax.eit import simulator

  layout = lay.from_rules(16, injection="skip-2", measure_injecting=True, clockwise=False)
  sim = simulator.Simulator(layout=layout.with_contact_impedance(0.05))
  yy, xx = (np.mgrid[:128, :128] - 63.5) / 64  # rows grow with +y (the simulator's grid)
  xs = np.zeros((128, 128), np.float32)
  xs[(xx - 0.35) ** 2 + (yy - 0.3) ** 2 < 0.25**2] = 1.0  # conductive, upper right
  xs[(xx + 0.4) ** 2 + (yy + 0.2) ** 2 < 0.25**2] = -1.0  # resistive, lower left
  volts = lambda sigma: 500.0 * np.asarray(sim.cem.voltages(sigma), np.float64)
  ref = volts(jnp.ones(sim.mesh.num_elements))
  target = volts(sim.image_conductivity(jnp.asarray(xs)))
  target *= 1 + 1e-3 * np.random.default_rng(4).standard_normal(target.shape)
  classes = np.where(xs > 0, 2, np.where(xs < 0, 1, 0)).astype(np.uint8)
  truth = ktc_score.to_challenge_grid(classes)
  inj, mpat = device_arrays(layout)
  gone = layout.without([3])
  for level, removed in ((1, np.zeros_like(gone)), (2, gone)):
    folder = tmp_path / "levels" / f"level_{level}"
    folder.mkdir(parents=True)
    scipy.io.savemat(folder / "ref.mat", {"Injref": inj, "Mpat": mpat, "Uelref": ref[:, None]})
    frame = np.where(removed, np.nan, target)[:, None]
    scipy.io.savemat(folder / "data1.mat", {"Inj": inj, "Mpat": mpat, "Uel": frame})
    scipy.io.savemat(folder / "true1.mat", {"truth": truth})
  out = tmp_path / "out"
  p = subprocess.run(
    [
      sys.executable,
      "eval.py",
      "--data=ktc2023_challenge",
      f"--data_path={tmp_path / 'levels'}",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=600,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert re.search(r"16 electrodes, 16 patterns, (skip \d+|adjacent), 256 values", p.stderr)
  assert re.search(r"gain 49\d\.\d+ .*contact impedance 0\.05\d* ", p.stderr), p.stderr
  r = json.loads((out / "metrics.json").read_text())["metrics"]
  for level in ("level_1", "level_2"):
    tik, water = (r[m]["ktc_score_per_level"][level] for m in ("tikhonov", "water"))
    assert tik > 0.6 and tik > water + 0.4, (level, tik, water)
  answer = scipy.io.loadmat(out / "level_2" / "1.mat")["reconstruction"]
  assert answer.shape == (256, 256) and answer[60, 180] == 2 and answer[170, 60] == 1
  missing = [f"--data_path={tmp_path / 'nothing'}", f"--out={tmp_path / 'out2'}"]
  p = subprocess.run(
    [sys.executable, "eval.py", "--data=ktc2023_challenge", *missing],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert p.returncode == 1 and p.stderr.count("error:") == 1 and "no such folder" in p.stderr
  assert "data/ktc2023/levels" in p.stderr  # where the public data are
  assert not (tmp_path / "out2").exists()  # a refused input leaves no empty --out


def test_a_refined_answer_is_the_models_own_with_the_networks_beside(device_run, levels, tmp_path):
  """--config.eval.refinement: the answers written are the network's refined against their
  frames (`challenge.refined` on the network's answers, as `cdeit_network` scores them beside),
  each refinement's record in metrics.json with a misfit no higher than before, the setting
  recorded."""
  from cdeit_jax.infer.refinement import Refinement

  setting = "objects:steps=2:move=4"
  common = {"sampling.num_samples": 1, "eval.figure": False, "eval.refinement": setting}
  level = os.path.join(_copy(levels, tmp_path, "level_2"), "level_2")
  m = challenge.evaluate(device_run.run, level, str(tmp_path / "out"), common)
  assert m["settings"]["refinement"] == str(Refinement.parse(setting))
  assert set(m["metrics"]) == {"cdeit", "cdeit_network", "water"}
  rec = m["refinement"]["level_2/1"]
  assert rec["steps"] <= 2
  if rec["objects"]:
    assert rec["misfit"] <= rec["misfit_before"]
  with pytest.raises(InputError, match="eval.refinement"):
    challenge.evaluate(
      device_run.run, level, str(tmp_path / "never"), {**common, "eval.refinement": "pixels"}
    )
  assert not (tmp_path / "never").exists()


def test_frames_far_above_every_real_misfit_are_named_in_one_line():
  """The flagged records' cases are named, each with its misfit, in one line; none, no line."""
  from types import SimpleNamespace

  from cdeit_jax.infer import refinement

  cases = [SimpleNamespace(path=f"L/data{i}.mat") for i in (1, 2, 3)]
  records = [
    {"misfit": 0.75, "flagged": True},
    {"misfit": 0.14, "flagged": False},
    {"misfit": 0.52, "flagged": True},
  ]
  line = challenge.flagged_line(cases, records)
  assert "\n" not in line and line.startswith("frames misfitting")
  assert "L/data1.mat (0.75)" in line and "L/data3.mat (0.52)" in line and "data2" not in line
  assert str(refinement.MISFIT_FLAG) in line
  assert challenge.flagged_line(cases, [{"misfit": 0.14, "flagged": False}] * 3) is None
