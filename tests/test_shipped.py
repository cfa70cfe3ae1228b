"""Model folders that ship with the code (`cdeit_jax.checkpoints.shipped`, `python -m
cdeit_jax.ship`): a trained run's best step, EMA weights only, with a manifest whose SHA-256 every
reader checks before it reads a byte of the model."""

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, run_train
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, reader, shipped
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import shipping

UEF = REPO / "data" / "uef2017"


def _run(*args):
  return subprocess.run(
    [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=300
  )


def _by_hand(folder: pathlib.Path, files: list[str]) -> str:
  """The manifest's digest written out again: each file's path, size and bytes, in order."""
  h = hashlib.sha256()
  for rel in files:
    data = (folder / rel).read_bytes()
    h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
  return h.hexdigest()


@pytest.fixture(scope="module")
def model_folder(straight_run, tmp_path_factory):
  """The uninterrupted 24-step run evaluated on UEF2017 and shipped with that score."""
  root = tmp_path_factory.mktemp("shipped")
  ev = _run(
    "eval.py",
    f"--workdir={straight_run}",
    "--data=uef2017",
    f"--data_path={UEF}",
    f"--out={root / 'eval'}",
    "--config.sampling.steps=2",
    "--config.eval.max_examples=4",
    "--config.eval.figure=False",
  )
  assert ev.returncode == 0, ev.stderr[-3000:]
  out = root / "models" / "tiny"
  p = _run(
    "-m",
    "cdeit_jax.ship",
    f"--workdir={straight_run}",
    f"--out={out}",
    "--recipe=make train-test",
    f"--scores=uef2017={root / 'eval' / 'metrics.json'}",
    "--set=eval.answer_rule=vote:0.3:0.5:area=0.01",
    "--set=sampling.num_samples=4",
  )
  assert p.returncode == 0, p.stderr[-3000:]
  assert "shipped step" in p.stdout
  return out, root


def test_the_folder_holds_the_best_steps_ema_weights_and_its_manifest(straight_run, model_folder):
  """One step (the run's best validated), EMA weights and metadata only; the manifest names the
  config, device, recipe, steps, time, machine and seeds, the score given, every file, and a
  SHA-256 equal to one computed by hand; the model loaded from the folder is the run's EMA."""
  out, root = model_folder
  m = json.loads((out / "manifest.json").read_text())
  best = checkpoint.best_step(str(straight_run))
  assert m["step"] == best and os.listdir(out / "checkpoints") == [str(best)]
  items = sorted(os.listdir(out / "checkpoints" / str(best)))
  assert "ema" in items and "params" not in items and "opt_state" not in items, items
  assert m["sha256"] == _by_hand(out, m["files"])
  assert m["files"] == sorted(
    str(p.relative_to(out)) for p in (out / "checkpoints").rglob("*") if p.is_file()
  )
  assert m["recipe"] == "make train-test" and m["training"]["steps"] == best
  records = [json.loads(x) for x in (straight_run / "metrics.jsonl").read_text().splitlines()]
  run = records[-1]["run"]
  by_hand = sum(r["window_s"] for r in records) + run["startup_s"] + run["compile_s"]
  assert m["training"]["seconds"] == pytest.approx(by_hand, abs=0.06)
  assert m["training"]["ended_invocations"] == 1
  assert "cores" in m["training"]["machine"] and m["training"]["data_seed"]["data"] == 0
  assert m["config"]["model"]["hidden_size"] == 32 and m["device"]["name"] == "cdeit16"
  # the settings shipped with it (--set) are the folder's config, which eval.py starts from
  assert m["config"]["eval"]["answer_rule"] == "vote:0.3:0.5:area=0.01"
  assert m["config"]["sampling"]["num_samples"] == 4
  want = json.loads((root / "eval" / "metrics.json").read_text())["metrics"]
  assert m["scores"]["uef2017"]["metrics"] == want
  shipped_model, meta = loading.load(str(out))
  assert loading.model_config(meta).sampling.num_samples == 4
  run_model, _ = loading.load(str(straight_run), step=best, weights="ema")
  a = jax.tree.leaves(nnx.state(shipped_model, nnx.Param))
  b = jax.tree.leaves(nnx.state(run_model, nnx.Param))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert meta["weights"] == ["ema"]


def test_a_changed_byte_or_file_is_refused_in_one_line(model_folder, tmp_path):
  """One byte of a weight file changed, a file added, the manifest damaged: every reader
  (loading, eval.py) refuses in one line naming the folder; training into a model folder is
  refused too; ship will not write over a folder that is not a model folder."""
  import shutil

  out, _ = model_folder
  bad = tmp_path / "bad"
  shutil.copytree(out, bad)
  weights = sorted(p for p in (bad / "checkpoints").rglob("*") if p.is_file() and "ema" in str(p))
  big = max(weights, key=lambda p: p.stat().st_size)
  original = big.read_bytes()
  changed = bytearray(original)
  changed[len(changed) // 2] ^= 1
  big.write_bytes(bytes(changed))
  with pytest.raises(shipped.ManifestError, match=r"model folder .*bad: its weights' SHA-256"):
    loading.load(str(bad))
  args = [f"--workdir={bad}", "--data=uef2017", f"--data_path={UEF}", f"--out={tmp_path / 'e'}"]
  p = _run("eval.py", *args)
  assert p.returncode == 1 and p.stderr.count("error:") == 1, p.stderr[-2000:]
  assert "SHA-256 is not the manifest's" in p.stderr and "Traceback" not in p.stderr
  assert not (tmp_path / "e").exists()
  big.write_bytes(original)
  loading.load(str(bad))  # restored: it reads again
  step = json.loads((bad / "manifest.json").read_text())["step"]
  (bad / "checkpoints" / str(step) / "extra.txt").write_text("x")
  with pytest.raises(shipped.ManifestError, match="files added"):
    loading.load(str(bad))
  (bad / "manifest.json").write_text("{")
  with pytest.raises(shipped.ManifestError, match="manifest.json: unreadable"):
    loading.load(str(bad))
  rc, _, err = run_train(out, "--config.steps=2")
  refused = f"--workdir {out} is the model folder {out}, a shipped model's, which is read-only"
  assert rc == 1 and refused in err, err[-2000:]
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "mine.txt").write_text("keep")
  p = _run("-m", "cdeit_jax.ship", f"--workdir={out}", f"--out={tmp_path / 'notes'}")
  assert p.returncode == 1 and "holds files and no manifest.json" in p.stderr, p.stderr[-2000:]
  assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"
  for setting, words in (
    ("model.hidden_size=64", "give KEY=VALUE of an evaluation setting"),
    ("eval.answer_rule=median:0.3", "--set eval.answer_rule='median:0.3': not an answer rule"),
    ("sampling.num_samples=four", "--set sampling.num_samples=four: not an integer"),
  ):
    p = _run(
      "-m", "cdeit_jax.ship", f"--workdir={out}", f"--out={tmp_path / 'x'}", f"--set={setting}"
    )
    assert p.returncode == 1 and p.stderr.count("error:") == 1 and words in p.stderr, p.stderr
    assert not (tmp_path / "x").exists()


def test_training_time_counts_a_killed_invocations_windows(tmp_path):
  """A run killed after two logged windows and resumed to its end: its time is the four windows
  plus the one recorded start-up and compilation (3 + 4 + 5 + 6 + 1.5 + 0.5 s), the killed
  invocation's windows included though it wrote no end record."""
  lines = [
    {"step": 2, "window_s": 3.0},
    {"step": 4, "window_s": 4.0},  # killed after this record
    {"step": 6, "window_s": 5.0},
    {"step": 8, "window_s": 6.0, "run": {"wall_s": 13.0, "startup_s": 1.5, "compile_s": 0.5}},
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  assert shipping.training_record(str(tmp_path)) == {"seconds": 20.0, "ended_invocations": 1}


def test_a_fine_tuned_models_time_counts_what_it_started_from(
  fine_tuned_run, straight_run, tmp_path
):
  """Shipping a config.init_from run: its manifest names the run it started from, with that
  run's steps and time (training_record by hand), and the seconds of both."""
  wd, _ = fine_tuned_run
  p = _run("-m", "cdeit_jax.ship", f"--workdir={wd}", f"--out={tmp_path / 'fine'}", "--recipe=x")
  assert p.returncode == 0, p.stderr[-3000:]
  t = json.loads((tmp_path / "fine" / "manifest.json").read_text())["training"]
  by_hand = lambda w: sum(
    r.get("window_s", 0.0) + (r["run"]["startup_s"] + r["run"]["compile_s"] if "run" in r else 0)
    for r in map(json.loads, (w / "metrics.jsonl").read_text().splitlines())
  )
  assert t["steps"] == 1 and t["seconds"] == pytest.approx(by_hand(wd), abs=0.1)
  base = t["started_from"]
  assert base["workdir"] == str(straight_run) and base["steps"] == 24
  assert base["seconds"] == pytest.approx(by_hand(straight_run), abs=0.1)
  assert t["seconds_in_all"] == pytest.approx(t["seconds"] + base["seconds"], abs=0.11)


def _random_step(workdir, cfg, seed, mean_factor=1.0):
  """An inference checkpoint (step 7) of the test model with random weights (seeded)."""
  from cdeit_jax.data import stats
  from cdeit_jax.model.network import CDEIT

  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(seed)
  state = jax.tree.map(lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), state)
  mean, std = stats.authors_stats()
  checkpoint.save_inference(
    str(workdir), nnx.merge(graphdef, state), cfg, mean=mean * mean_factor, std=std, step=7
  )
  return loading.load(str(workdir))[0]


# make test-all: 20 s; interpolation:
#  test_interpolation_mixes_the_step_the_fine_tuning_started_from
@pytest.mark.slow
def test_wise_ft_writes_the_line_between_start_and_fine_tuned(tmp_path):
  """interpolate --alpha 0.25: the checkpoint's weights are 0.75 x the start's + 0.25 x the
  fine-tuned run's (by hand from both); a model shipped from it names what it is made of and
  both runs; refused in one line for a run that did not start from another, one whose inputs
  are normalised otherwise, an alpha outside (0, 1], or a bucket's --out (os.path.abspath
  would have made it a local folder named "gs:")."""
  from cdeit_jax.checkpoints import interpolate

  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  start = _random_step(tmp_path / "start", cfg, 1)
  cfg.init_from = str(tmp_path / "start")
  fine = _random_step(tmp_path / "fine", cfg, 2)
  interpolate.write(str(tmp_path / "fine"), 0.25, str(tmp_path / "wise"))
  made, meta = loading.load(str(tmp_path / "wise"))
  with reader.open_run(str(tmp_path / "wise")) as run:  # one step, no validation loss
    assert run.reason(7, {}) == "its only step"
  assert meta["step"] == 7 and meta["config"]["init_from"] == str(tmp_path / "fine")
  by_hand = jax.tree.map(
    lambda s, f: 0.75 * np.asarray(s) + 0.25 * np.asarray(f),
    nnx.state(start, nnx.Param),
    nnx.state(fine, nnx.Param),
  )
  got = jax.tree.leaves(nnx.state(made, nnx.Param))
  for a, b in zip(got, jax.tree.leaves(by_hand)):
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-7)
  assert not np.allclose(got[0], jax.tree.leaves(nnx.state(fine, nnx.Param))[0])
  m = shipping.ship(str(tmp_path / "wise"), str(tmp_path / "out"), "r", [], None)
  t = m["training"]
  assert t["made_of"] == (
    f"WiSE-FT: 0.75 x {tmp_path / 'start'} step 7 + 0.25 x {tmp_path / 'fine'} step 7 (EMA weights)"
  )
  assert t["started_from"]["workdir"] == str(tmp_path / "fine")
  assert t["started_from"]["started_from"]["workdir"] == str(tmp_path / "start")

  interpolate.write(str(tmp_path / "fine"), 0.25, str(tmp_path / "wise"))  # replaced whole
  assert sorted(os.listdir(tmp_path / "wise")) == ["checkpoints"]
  with pytest.raises(InputError, match=r"--out .*start contains the checkpoints it started from"):
    interpolate.write(str(tmp_path / "fine"), 0.25, str(tmp_path / "start"))
  (tmp_path / "mine").mkdir()
  with pytest.raises(InputError, match=r"--out .*mine: exists and is not a checkpoint written"):
    interpolate.write(str(tmp_path / "fine"), 0.25, str(tmp_path / "mine"))
  with pytest.raises(InputError, match=r"--out .*fine/checkpoints/w lies inside --workdir's check"):
    interpolate.write(str(tmp_path / "fine"), 0.25, str(tmp_path / "fine" / "checkpoints" / "w"))
  with pytest.raises(InputError, match=r"--alpha 0.5: this run did not start from another"):
    interpolate.write(str(tmp_path / "start"), 0.5, str(tmp_path / "o2"))
  _random_step(tmp_path / "other", cfg, 3, mean_factor=2.0)
  with pytest.raises(InputError, match=r"differ in their normalisation statistics; .*interpolate"):
    interpolate.write(str(tmp_path / "other"), 0.5, str(tmp_path / "o3"))
  with pytest.raises(InputError, match=r"--alpha 1.5: give the fine-tuned weights' share"):
    interpolate.write(str(tmp_path / "fine"), 1.5, str(tmp_path / "o4"))
  with pytest.raises(
    InputError, match=r"--out gs://b/wise: the interpolated checkpoint is written to a lo"
  ):
    interpolate.write(str(tmp_path / "fine"), 0.25, "gs://b/wise")


def test_the_models_in_the_repository_match_their_manifests():
  """Every folder under models/ is a model folder whose files are its manifest's (SHA-256)."""
  folders = sorted(p for p in (REPO / "models").iterdir() if p.is_dir())
  assert folders, "models/ holds no model folder"
  for folder in folders:
    manifest = shipped.verify(str(folder))
    assert manifest is not None and manifest["name"] == folder.name


def test_interpolation_mixes_the_step_the_fine_tuning_started_from(straight_run, tmp_path):
  """A (a copy of the 24-step run) fine-tuned into B, then A trained on to step 32: B records
  A's step 24 and its fingerprint, and interpolate mixes step 24 (by hand), not the newest
  (before: A's step 32). A step 24 whose EMA bytes changed, or that is gone, is refused in one
  line naming the step and the run. A model shipped from B ships again once A's step is gone
  (its manifest's training kept)."""
  import shutil

  from cdeit_jax.checkpoints import interpolate

  a, b = tmp_path / "A", tmp_path / "B"
  shutil.copytree(straight_run, a)
  rc, _, err = run_train(b, "--config.steps=1", f"--config.init_from={a}")
  assert rc == 0, err[-3000:]
  rc, _, err = run_train(a, "--config.steps=32", "--config.eval_every=8")
  assert rc == 0, err[-3000:]
  assert 32 in checkpoint.all_steps(str(a)) and 24 in checkpoint.all_steps(str(a))
  record = checkpoint.read_meta(str(b), 1)["init_from"]
  assert (record["workdir"], record["step"]) == (str(a), 24)
  assert record["sha256"] == checkpoint.fingerprint(str(a), 24)
  interpolate.write(str(b), 0.5, str(tmp_path / "wise"))
  made, meta = loading.load(str(tmp_path / "wise"))
  assert meta["source"].startswith(f"WiSE-FT: 0.5 x {a} step 24 + 0.5 x {b} step 1")
  start, _ = loading.load(str(a), step=24, weights="ema")
  fine, _ = loading.load(str(b), weights="ema")
  by_hand = jax.tree.map(
    lambda s, f: 0.5 * np.asarray(s) + 0.5 * np.asarray(f),
    nnx.state(start, nnx.Param),
    nnx.state(fine, nnx.Param),
  )
  for x, y in zip(jax.tree.leaves(nnx.state(made, nnx.Param)), jax.tree.leaves(by_hand)):
    np.testing.assert_allclose(np.asarray(x), y, rtol=1e-6, atol=1e-7)

  first = shipping.ship(str(b), str(tmp_path / "M1"), "r", [], None)  # records A step 24
  assert first["training"]["started_from"]["steps"] == 24

  big = max(
    (p for p in (a / "checkpoints" / "24" / "ema").rglob("*") if p.is_file()),
    key=lambda p: p.stat().st_size,
  )
  data = bytearray(big.read_bytes())
  data[len(data) // 2] ^= 1
  big.write_bytes(bytes(data))
  p = _run(
    "-m",
    "cdeit_jax.interpolate",
    f"--workdir={b}",
    "--alpha=0.5",
    f"--out={tmp_path / 'w2'}",
  )
  assert p.returncode == 1 and p.stderr.count("error:") == 1 and "Traceback" not in p.stderr, (
    p.stderr
  )
  assert (
    f"fine-tuned from step 24 of {a} (config.init_from), whose EMA weights or metadata changed"
    in p.stderr
  )
  shutil.rmtree(a / "checkpoints" / "24")
  with pytest.raises(
    InputError,
    match=rf"from step 24 of {a} \(config.init_from\), which is gone \(that folder holds \[.*32\]",
  ):
    interpolate.write(str(b), 0.5, str(tmp_path / "w3"))
  assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()
  # the model shipped from B, away from A (its builder's start is gone): shipped again with
  # another rule, its manifest keeps the training it records
  again = shipping.ship(
    str(tmp_path / "M1"), str(tmp_path / "M2"), "r2", [], None, ["sampling.steps=3"]
  )
  assert again["training"] == {**first["training"], "shipped": again["training"]["shipped"]}
  assert again["config"]["sampling"]["steps"] == 3


def test_a_model_folder_shipped_again_with_a_new_calibration(model_folder, tmp_path):
  """`ship --out M --calibration F --scores NAME=...`: a copy of the shipped folder gets the
  split-conformal calibration F in its step (what eval.py then applies by default) and the scores
  given in place of those names; every other file's bytes, the config and the training stay;
  the manifest verifies (its digest by hand). Refused in one line, the folder left as it was: a
  calibration the readers refuse, --workdir beside --calibration, and a manifest that would hold
  intervals of another calibration (a score given, or one kept, evaluated with other scales)."""
  from cdeit_jax.infer import intervals, run_opening

  out, root = model_folder
  folder = tmp_path / "models" / "tiny"
  shutil.copytree(out, folder)
  before = json.loads((folder / "manifest.json").read_text())
  step_dir = folder / "checkpoints" / str(before["step"])
  fitted = intervals.fit(np.random.default_rng(0).exponential(1.0, 10_000))
  cal = tmp_path / "uncertainty.json"
  cal.write_text(json.dumps({**fitted.record(), "examples": 3}))

  def score(name: str, scale: float, scale_2std: float) -> str:
    u = {"scale": scale, "scale_2std": scale_2std, "coverage_1std": 0.683}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"metrics": {"cdeit": {"rmse": 0.5}, "uncertainty": u}}))
    return f"--scores={name}={path}"

  ok = (fitted.std_scale, fitted.scale(intervals.TWO_SIGMA))
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"scale": -1}))
  other = intervals.fit(np.random.default_rng(1).exponential(2.0, 10_000))
  cal2 = tmp_path / "other.json"
  cal2.write_text(json.dumps(other.record()))

  def refused(args, why):
    p = _run("-m", "cdeit_jax.ship", f"--out={folder}", *args)
    assert p.returncode == 1 and why in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr

  refused([f"--calibration={bad}"], "'scale' must be a positive number")
  refused([f"--calibration={cal}", f"--workdir={out}"], "leave --workdir out")
  refused([f"--calibration={cal}", score("sim", 1.0, 2.0)], "--scores sim: its intervals")
  assert json.loads((folder / "manifest.json").read_text()) == before
  p = _run("-m", "cdeit_jax.ship", f"--out={folder}", f"--calibration={cal}", score("uef2017", *ok))
  assert p.returncode == 0 and "again with the calibration" in p.stdout, p.stderr[-3000:]
  m = shipped.verify(str(folder))
  # another calibration now: the kept uef2017 score is of this one, so it must come again
  refused([f"--calibration={cal2}"], "the manifest's score 'uef2017'")
  assert shipped.verify(str(folder)) == m
  kept = str((step_dir / run_opening.UNCERTAINTY_FILE).relative_to(folder))
  assert m["sha256"] == _by_hand(folder, m["files"])
  assert set(m["files"]) == {*before["files"], kept}
  for rel in m["files"]:
    if rel != kept:
      assert (folder / rel).read_bytes() == (out / rel).read_bytes(), rel
  assert (step_dir / run_opening.UNCERTAINTY_FILE).read_text() == cal.read_text()
  got = intervals.read(str(step_dir / run_opening.UNCERTAINTY_FILE))
  assert got.method == "split-conformal" and got.scales == fitted.scales
  assert m["scores"]["uef2017"]["metrics"]["uncertainty"]["scale"] == ok[0]
  assert m["config"] == before["config"] and m["recipe"] == before["recipe"]
  assert {k: v for k, v in m["training"].items() if k != "recalibrated"} == before["training"]


def test_a_model_folder_shipped_again_with_a_setting(model_folder, tmp_path):
  """`ship --out M --set eval.refinement=...`: the copy's step evaluates with the setting by
  default (its config, read back by eval.py's opening, and the manifest's), every file other
  than the step's meta keeps its bytes, the manifest verifies; a setting eval.py would refuse
  and nothing to change are refused in one line with the folder as it was."""
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import run_opening, shipping

  out, _ = model_folder
  folder = tmp_path / "models" / "tiny"
  shutil.copytree(out, folder)
  before = json.loads((folder / "manifest.json").read_text())
  for sets, words in ((["eval.refinement=pixels"], "--set eval.refinement"), ([], "--set")):
    with pytest.raises(InputError, match=words):
      shipping.ship_again(str(folder), None, [], sets)
  assert json.loads((folder / "manifest.json").read_text()) == before
  m = shipping.ship_again(str(folder), None, [], ["eval.refinement=objects:move=4"])
  assert m["config"]["eval"]["refinement"] == "objects:move=4"
  assert {k: v for k, v in m["config"].items() if k != "eval"} == {
    k: v for k, v in before["config"].items() if k != "eval"
  }
  assert m["sha256"] == _by_hand(folder, m["files"]) and m["files"] == before["files"]
  meta = f"checkpoints/{before['step']}/meta/metadata"
  for rel in m["files"]:
    if rel != meta:
      assert (folder / rel).read_bytes() == (out / rel).read_bytes(), rel
  with run_opening.open_run(str(folder)) as opened:
    assert opened.cfg.eval.refinement == "objects:move=4"


@pytest.fixture(scope="module")
def tiny_model(tiny_run, tmp_path_factory):
  """The tiny test model (`tiny_run`) shipped as a model folder: copies of it are shipped again
  by the tests below (cheaper than a trained run)."""
  out = tmp_path_factory.mktemp("tiny_model") / "tiny"
  shipping.ship(tiny_run, str(out), "r", [], None)
  return out


def _hashes(root: pathlib.Path) -> dict[str, str]:
  """Every file below `root` (links too, as links) by its bytes' SHA-256."""
  out = {}
  for p in sorted(root.rglob("*")):
    if p.is_symlink():
      out[str(p.relative_to(root))] = "-> " + os.readlink(p)
    elif p.is_file():
      out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
  return out


def _copy(tiny_model, tmp_path) -> pathlib.Path:
  folder = tmp_path / "models" / "tiny"
  shutil.copytree(tiny_model, folder)
  return folder


@pytest.mark.parametrize(
  "setting, why",
  [
    ("eval.voltage_ratio=abc", "--set eval.voltage_ratio=abc: not a number (or None)"),
    ("eval.voltage_ratio=-1", "--set eval.voltage_ratio=-1.0: must be a positive number"),
    ("eval.current_ratio=0", "--set eval.current_ratio=0.0: must be a positive number"),
    ("sampling.batch_size=4.5", "--set sampling.batch_size=4.5: not an integer"),
    ("sampling.num_samples=-1", "--set sampling.num_samples=-1: must be an integer from 1"),
    ("sampling.steps=0", "--set sampling.steps=0: must be >= 1"),
    ("sampling.eta=nan", "--set sampling.eta=nan: must be a finite number"),
    ("sampling.eta=2", "--set sampling.eta=2.0: must be in [0, 1]"),
    ("eval.max_examples=0", "--set eval.max_examples=0: must be >= 1"),
    ("eval.calibration=/etc/passwd", "--set eval.calibration=/etc/passwd: a model folder keeps"),
    ("eval.stats=/tmp", "--set eval.stats=/tmp: a model folder keeps no path"),
    ("eval.step=3", "--set eval.step=3: a model folder holds one step"),
    ("eval.weights=raw", "--set eval.weights=raw: the model folder holds the ema weights only"),
    ("eval.refinement=pixels", "--set eval.refinement='pixels'"),
    ("eval.answer_rule=nope", "--set eval.answer_rule"),
    ("sampling.symmetric=maybe", "--set sampling.symmetric=maybe: not True or False"),
    ("eval.foo=1", "--set eval.foo=1: no such setting; config.eval has"),
    ("eval.answer_rule.x=1", "--set eval.answer_rule.x=1: no such setting"),
    ("model.dtype=float16", "--set 'model.dtype=float16': give KEY=VALUE of an evaluation"),
  ],
)
def test_a_refused_setting_leaves_the_folder_byte_identical(tiny_model, tmp_path, setting, why):
  """`ship --out M --set KEY=VALUE`: a value is read as its config field's type and checked as
  every reader checks the config (run_opening.settings), paths and steps are refused; the
  refusal is one line naming --set (never --config), and every file beside and below M keeps
  its bytes (no stage, no backup left)."""
  folder = _copy(tiny_model, tmp_path)
  before = _hashes(tmp_path)
  with pytest.raises(InputError) as e:
    shipping.ship_again(str(folder), None, [], [setting])
  assert str(e.value).startswith(why) and "--config" not in str(e.value), e.value
  assert "\n" not in str(e.value)
  assert _hashes(tmp_path) == before


def test_numbers_given_as_text_are_stored_as_numbers_and_read_back(tiny_model, tmp_path):
  """`--set eval.voltage_ratio=1040.86` (a float field whose default is None), `--set
  sampling.batch_size=4`, `--set eval.max_examples=2`, a bool and a tuple: stored as the field's
  type, so the folder verifies and every reader opens it with those values."""
  from cdeit_jax.infer import run_opening

  folder = _copy(tiny_model, tmp_path)
  sets = [
    "eval.voltage_ratio=1040.86",
    "sampling.batch_size=4",
    "eval.max_examples=2",
    "eval.figure=false",
    "eval.interval_levels=(0.9,)",
  ]
  m = shipping.ship_again(str(folder), None, [], sets)
  assert m["config"]["eval"]["voltage_ratio"] == 1040.86
  assert m["config"]["sampling"]["batch_size"] == 4 and m["config"]["eval"]["max_examples"] == 2
  assert shipped.verify(str(folder)) == m
  with run_opening.open_run(str(folder)) as opened:
    e, s = opened.cfg.eval, opened.cfg.sampling
    assert (e.voltage_ratio, s.batch_size, e.max_examples) == (1040.86, 4, 2)
    assert type(e.voltage_ratio) is float and type(s.batch_size) is int
    assert e.figure is False and tuple(e.interval_levels) == (0.9,)
  assert sorted(os.listdir(tmp_path / "models")) == ["tiny"]  # no stage, no backup left


def test_ship_keeps_what_it_did_not_make(tiny_model, tmp_path):
  """A user's `M.shipping` and `M.old` beside --out M are neither removed nor in the way; --out
  a file is refused in one line; --out LINK (a link to a model folder) ships the folder the link
  names in its place and keeps the link."""
  folder = _copy(tiny_model, tmp_path)
  for mine in ("tiny.shipping", "tiny.old"):
    (tmp_path / "models" / mine).mkdir()
    (tmp_path / "models" / mine / "my_notes.txt").write_text("mine")
  shipping.ship_again(str(folder), None, [], ["sampling.steps=3"])
  for mine in ("tiny.shipping", "tiny.old"):
    assert (tmp_path / "models" / mine / "my_notes.txt").read_text() == "mine"
  assert sorted(os.listdir(tmp_path / "models")) == ["tiny", "tiny.old", "tiny.shipping"]
  (tmp_path / "file").write_text("x")
  with pytest.raises(InputError, match="--out .*file: exists and is not a folder"):
    shipping.ship_again(str(tmp_path / "file"), None, [], ["sampling.steps=3"])
  link = tmp_path / "current"
  link.symlink_to(folder)
  m = shipping.ship_again(str(link), None, [], ["sampling.steps=4"])
  assert link.is_symlink() and os.readlink(link) == str(folder)
  assert shipped.verify(str(folder)) == m and m["config"]["sampling"]["steps"] == 4
  assert sorted(os.listdir(tmp_path)) == ["current", "file", "models"]


def _gone_pid() -> int:
  """The pid of a process that has ended (its stages are stale)."""
  p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
  return int(p.stdout)


def test_a_ship_stopped_between_its_renames_is_named_and_put_back(tiny_model, tmp_path):
  """A ship killed after moving M aside and before putting its new copy in place leaves no M:
  every reader names where the model is in one line, and the next ship puts it back first (and
  removes a killed ship's half-made stage); an older ship's `M.old` is named, never moved."""
  from cdeit_jax.checkpoints import checkpoint
  from cdeit_jax.common.errors import CdeitError

  folder = _copy(tiny_model, tmp_path)
  before = _hashes(folder)
  pid = _gone_pid()
  aside = tmp_path / "models" / f"{shipped.replaced_prefix(str(folder))}{pid}-x1"
  stage = tmp_path / "models" / f"{shipped.stage_prefix(str(folder))}{pid}-x2"
  folder.rename(aside)
  stage.mkdir()
  (stage / "half").write_text("")
  for read in (shipped.verify, checkpoint.locate):
    with pytest.raises(CdeitError, match=f"its model is in {aside} .*mv {aside} {folder}"):
      read(str(folder))
  m = shipping.ship_again(str(folder), None, [], ["sampling.steps=3"])
  assert shipped.verify(str(folder)) == m and sorted(os.listdir(tmp_path / "models")) == ["tiny"]
  assert {k: v for k, v in _hashes(folder).items() if "meta" not in k and "manifest" not in k} == {
    k: v for k, v in before.items() if "meta" not in k and "manifest" not in k
  }
  old = tmp_path / "models" / "tiny.old"
  folder.rename(old)  # as an older ship, which named its backup so, left it
  with pytest.raises(InputError, match=f"its model is in {old} "):
    shipping.ship_again(str(folder), None, [], ["sampling.steps=4"])
  assert shipped.verify(str(old)) == m


def test_a_score_or_calibration_that_is_not_one_is_refused(tiny_model, tmp_path):
  """--scores takes an evaluation's metrics.json only (an object with figures, no NaN, positive
  std scales, at most 1 MB); --calibration a record of positive numbers (not true) up to 1e6
  that grow with the level; each refusal one line naming the flag, the folder unchanged."""
  from cdeit_jax.infer import intervals

  folder = _copy(tiny_model, tmp_path)
  before = _hashes(tmp_path / "models")

  def metrics(name, text):
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    return f"{name}={path}"

  for text, why in [
    ("[1, 2]", "holds no 'metrics' object"),
    ('{"metrics": "good"}', "holds no 'metrics' object"),
    ('{"metrics": {"cdeit": {"rmse": "low"}}}', "holds no 'metrics' object"),
    ('{"metrics": {"cdeit": {"rmse": NaN}}}', "NaN is no number JSON knows"),
    ('{"metrics": {"cdeit": {"rmse": 1}}, "settings": 3}', "its 'settings' is not an object"),
    ('{"metrics": {"uncertainty": {"scale": -1}}}', "holds no positive std scales"),
    ('{"metrics": {"x": 1}, "pad": "' + "x" * 1_000_001 + '"}', "bytes, not an evaluation's"),
  ]:
    with pytest.raises(InputError, match=f"--scores s=.*: .*{re.escape(why)}"):
      shipping.ship_again(str(folder), None, [metrics("s", text)], ["sampling.steps=3"])
  fitted = intervals.fit(np.random.default_rng(0).exponential(1.0, 1000)).record()
  for record, why in [
    ({"scale": True}, "'scale' must be a positive number up to 1e+06, got True"),
    ({"scale": 1e308}, "'scale' must be a positive number up to 1e+06"),
    ({**fitted, "scales": {k: 1.0 / (i + 1) for i, k in enumerate(fitted["scales"])}}, "grow"),
  ]:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(record))
    with pytest.raises(InputError, match=f"{cal}: .*{re.escape(why)}"):
      shipping.ship_again(str(folder), str(cal), [], [])
  assert _hashes(tmp_path / "models") == before


def test_a_segmenter_takes_no_calibration(tiny_model, tmp_path):
  """A model whose outputs are classes (KTC2023's segmenter) has no std: --calibration is
  refused in one line, the folder unchanged (its manifest's config says `output: classes`)."""
  from cdeit_jax.infer import intervals

  folder = _copy(tiny_model, tmp_path)
  m = json.loads((folder / "manifest.json").read_text())
  m["config"]["model"]["output"] = "classes"
  m[shipped.OWN] = shipped.own_digest(m)
  (folder / "manifest.json").write_text(json.dumps(m))
  before = _hashes(tmp_path / "models")
  cal = tmp_path / "cal.json"
  cal.write_text(json.dumps(intervals.fit(np.ones(100)).record()))
  with pytest.raises(InputError, match="--calibration .*a segmenter's"):
    shipping.ship_again(str(folder), str(cal), [], [])
  assert _hashes(tmp_path / "models") == before


@pytest.mark.e2e
def test_two_ships_at_once_leave_a_folder_that_verifies(tiny_model, tmp_path):
  """Two `ship --set` processes on one folder at once, 4 times: they take turns (the lock on
  the folder's parent): each either ships or is refused in one line saying another ship is
  writing, at least one ships, and the folder verifies with the setting of the last that did."""
  folder = _copy(tiny_model, tmp_path)
  code = (
    "import sys; from cdeit_jax.infer import shipping; "
    "shipping.ship_again(sys.argv[1], None, [], [sys.argv[2]])"
  )
  for attempt in range(4):
    procs = [
      subprocess.Popen(
        [sys.executable, "-c", code, str(folder), f"sampling.steps={10 * attempt + k + 1}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
      for k in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:
      assert rc == 0 or "another python -m cdeit_jax.ship is writing" in err, err[-2000:]
    assert any(rc == 0 for rc, _ in results)
    m = shipped.verify(str(folder))
    assert m["config"]["sampling"]["steps"] in {10 * attempt + 1, 10 * attempt + 2}
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny"]
