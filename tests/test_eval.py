"""eval.py (infer.evaluate through data_kinds.evaluate): outputs, determinism, bad inputs,
memory. (The metrics: test_metrics.py.)"""

import errno
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import mat73
import numpy as np
import pytest
from conftest import FIXTURES, finish, system_of, two_processes
from flax import nnx

from cdeit_jax import config_lib, convert
from cdeit_jax.common import device_memory
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import data_kinds, evaluate, intervals, metrics, outputs, run_opening, sampling
from cdeit_jax.model.network import CDEIT

REPO = pathlib.Path(__file__).parent.parent
UEF = str(REPO / "data" / "uef2017")


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory):
  """The reference's small model (fixture weights) imported with `convert`."""
  wd = tmp_path_factory.mktemp("fixture_run")
  cfg = config_lib.default_config()
  cfg.model.hidden_size = 64
  convert.convert(str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(wd))
  return str(wd)


@pytest.mark.e2e
def test_fixture_model_on_uef2017_writes_every_output(fixture_run, tmp_path):
  out = tmp_path / "out"
  r = data_kinds.evaluate(
    fixture_run,
    "uef2017",
    UEF,
    str(out),
    {
      "sampling.steps": 1,
      "sampling.batch_size": 8,
      "model.attention_query_chunk": 512,
      "eval.max_examples": 8,
    },
  )
  assert r["devices"] == 8
  for f in (
    "metrics.json",
    "metrics.csv",
    "predictions.npz",
    "predictions.mat",
    "reconstructions.png",
  ):
    assert (out / f).stat().st_size > 0, f
  assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
  m = json.loads((out / "metrics.json").read_text())
  assert set(m["metrics"]) == {"cdeit", "empty", "TR", "xs_gn"} and m["settings"]["examples"] == 8
  assert m["settings"]["checkpoint_step"] == 0 and m["images_per_s"] > 0
  assert len((out / "metrics.csv").read_text().strip().splitlines()) == 9
  z = np.load(out / "predictions.npz")
  assert z["pred"].shape == (8, 128, 128, 1) and list(z["names"])[0] == "1_1.npz"
  assert np.all(np.isfinite(z["pred"])) and z["pred"].std() > 0.01
  mat = mat73.loadmat(out / "predictions.mat")
  np.testing.assert_allclose(mat["pred"], z["pred"][..., 0] * 2 / 1040.856, rtol=1e-6)
  # the overall RMSE is recomputable from the saved arrays
  assert m["metrics"]["cdeit"]["rmse"] == pytest.approx(
    np.sqrt(((z["pred"] - z["target"]) ** 2).mean()), rel=1e-6
  )
  # one device, through the command line: the same reconstructions (first 2 files)
  r = _eval_cli(
    "--workdir",
    fixture_run,
    "--data",
    "uef2017",
    "--data_path",
    UEF,
    "--out",
    str(tmp_path / "one"),
    "--config.sampling.steps=1",
    "--config.sampling.batch_size=2",
    "--config.eval.max_examples=2",
    "--config.model.attention_query_chunk=512",
    "--config.eval.figure=False",
    devices=1,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  settings = json.loads((tmp_path / "one" / "metrics.json").read_text())["settings"]
  assert settings["sampling_steps"] == 1 and settings["config"]["sampling"]["steps"] == 1
  assert settings["config"]["overrides"]["sampling.batch_size"] == 2
  one = np.load(tmp_path / "one" / "predictions.npz")
  np.testing.assert_allclose(one["pred"], z["pred"][:2], atol=1e-5, rtol=0)


def test_a_new_evaluation_replaces_every_old_output(tiny_run, tmp_path):
  """An evaluation without a figure into a folder holding an earlier one's outputs (and a
  user's own file): no old figure is left beside the new metrics, the user's file is kept;
  a user's file of an output's name (not in the folder's manifest) stops the evaluation before
  any work and stays; non-numbers are JSON null."""
  out = tmp_path / "out"
  data_kinds.evaluate(tiny_run, "uef2017", UEF, str(out), {"eval.max_examples": 2})
  before = {f: (out / f).read_bytes() for f in outputs.OUTPUTS}
  (out / "notes.txt").write_text("mine")
  r = data_kinds.evaluate(
    tiny_run, "uef2017", UEF, str(out), {"eval.max_examples": 3, "eval.figure": False}
  )
  assert not (out / "reconstructions.png").exists() and (out / "notes.txt").read_text() == "mine"
  for f in outputs.OUTPUTS[1:]:
    assert (out / f).read_bytes() != before[f], f
  assert json.loads((out / "metrics.json").read_text())["settings"]["examples"] == 3
  r["metrics"]["cdeit"]["psnr"] = float("nan")
  assert outputs.json_clean(r)["metrics"]["cdeit"]["psnr"] is None
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "metrics.csv").write_text("the user's")
  with pytest.raises(InputError, match="metrics.csv is there and was not written by cdeit-jax"):
    data_kinds.evaluate(tiny_run, "uef2017", UEF, str(mine), {"eval.max_examples": 2})
  assert os.listdir(mine) == ["metrics.csv"] and (mine / "metrics.csv").read_text() == "the user's"


def test_the_authors_layout_keeps_the_checkpoints_statistics(tiny_run, tmp_path, caplog):
  """UEF2017's files in D/test2017 with other statistics in D (the authors' mean.pth/std.pth
  layout): the same predictions as the files alone, the checkpoint's statistics named in
  metrics.json and the folder's in one warning with the flag; that flag uses them."""
  from cdeit_jax.data import stats

  data = tmp_path / "D"
  (data / "test2017").mkdir(parents=True)
  for f in sorted(os.listdir(UEF))[:2]:
    (data / "test2017" / f).write_bytes((pathlib.Path(UEF) / f).read_bytes())
  mean, std = stats.authors_stats()
  np.save(data / "mean.npy", mean * 0.5)
  np.save(data / "std.npy", std * 3.0)
  settings = {"eval.max_examples": 2, "eval.figure": False}
  data_kinds.evaluate(tiny_run, "uef2017", UEF, str(tmp_path / "alone"), settings)
  with caplog.at_level(logging.WARNING):
    data_kinds.evaluate(tiny_run, "uef2017", str(data / "test2017"), str(tmp_path / "a"), settings)
  assert any(
    f"{data}/mean.npy and {data}/std.npy differ" in r.getMessage()
    and f"--config.eval.stats={data}" in r.getMessage()
    for r in caplog.records
  )
  alone, a = (np.load(tmp_path / n / "predictions.npz")["pred"] for n in ("alone", "a"))
  np.testing.assert_array_equal(a, alone)
  record = json.loads((tmp_path / "a" / "metrics.json").read_text())["settings"]["statistics"]
  digest = __import__("hashlib").sha256(mean.astype("<f4").tobytes() + std.astype("<f4").tobytes())
  assert record == {"source": "checkpoint", "files": None, "sha256": digest.hexdigest()}
  data_kinds.evaluate(
    tiny_run,
    "uef2017",
    str(data / "test2017"),
    str(tmp_path / "b"),
    {**settings, "eval.stats": str(data)},
  )
  record = json.loads((tmp_path / "b" / "metrics.json").read_text())["settings"]["statistics"]
  assert record["source"] == str(data) and record["files"] == [
    f"{data}/mean.npy",
    f"{data}/std.npy",
  ]
  assert not np.allclose(np.load(tmp_path / "b" / "predictions.npz")["pred"], alone)


def test_a_failed_evaluation_keeps_the_previous_one(tiny_run, tmp_path, monkeypatch):
  """The disk fills while a new evaluation writes its outputs: the earlier evaluation stays byte
  for byte, no temporary file or staging folder is left, and the error names the output folder;
  the data folder itself is refused as --out."""
  out = tmp_path / "out"
  data_kinds.evaluate(tiny_run, "uef2017", UEF, str(out), {"eval.max_examples": 2})
  before = {f: (out / f).read_bytes() for f in os.listdir(out)}
  assert sorted(before) == sorted([*outputs.OUTPUTS, outputs.MANIFEST])

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  import zipfile

  monkeypatch.setattr(zipfile.ZipFile, "write", full)  # predictions.npz, after every array
  with pytest.raises(OSError, match=f"no space left on the device of {out}: ") as e:
    data_kinds.evaluate(tiny_run, "uef2017", UEF, str(out), {"eval.max_examples": 3})
  assert e.value.errno == errno.ENOSPC and "\n" not in str(e.value)
  assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
  with pytest.raises(ValueError, match="is the data folder"):
    data_kinds.evaluate(tiny_run, "uef2017", UEF, UEF, {"eval.max_examples": 2})


@pytest.mark.e2e
def test_uncertainty_scale_is_fitted_kept_in_the_step_and_applied(tiny_run, tmp_path):
  """fit_uncertainty on simulations writes the step's uncertainty.json (split-conformal: the 1-
  and 2-std scales, and a user's level); a later evaluation of that step scales its std by the
  1-std one and reports the coverage at both; a calibration kept elsewhere is applied with
  --config.eval.calibration; real data cannot fit it."""
  sims = tmp_path / "sims"
  import dataclasses

  from cdeit_jax import simulate
  from cdeit_jax.eit.spec import SystemSpec

  cfg = config_lib.default_config()
  cfg.simulator.system.update(dataclasses.asdict(SystemSpec.nominal()))  # the faster solve
  simulate.generate(str(sims), {"test": 6}, cfg.simulator, batch_size=8, progress=False)
  common = {"sampling.num_samples": 3, "eval.figure": False, "sampling.steps": 3}
  import shutil

  tiny_run = str(shutil.copytree(tiny_run, tmp_path / "run"))  # its own step folder to write
  first = data_kinds.evaluate(
    tiny_run,
    "simulated",
    str(sims / "test"),
    str(tmp_path / "a"),
    {**common, "eval.fit_uncertainty": True, "eval.interval_levels": (0.9,)},
  )
  kept_file = pathlib.Path(tiny_run) / "checkpoints" / "7" / "uncertainty.json"
  kept = json.loads(kept_file.read_text())
  z = np.load(tmp_path / "a" / "predictions.npz")
  raw_std = z["samples"].std(0)[..., 0]
  want = intervals.fit_images(z["pred"][..., 0], raw_std, z["target"][..., 0], (0.9,))
  assert kept["scale"] == pytest.approx(want.std_scale, rel=1e-6)
  assert kept["scales"][repr(intervals.TWO_SIGMA)] == pytest.approx(
    want.scale(intervals.TWO_SIGMA), rel=1e-6
  )
  assert set(kept["scales"]) == {repr(v) for v in (intervals.ONE_SIGMA, 0.9, intervals.TWO_SIGMA)}
  u = first["metrics"]["uncertainty"]
  assert u["scale"] == kept["scale"] and u["coverage_1std"] == pytest.approx(0.683, abs=0.01)
  assert u["coverage_2std"] == pytest.approx(0.954, abs=0.01) and u["scale_2std"] > u["scale"]
  np.testing.assert_allclose(z["std"][..., 0], raw_std * kept["scale"], rtol=1e-5)
  again = data_kinds.evaluate(
    tiny_run, "uef2017", UEF, str(tmp_path / "b"), {**common, "eval.max_examples": 2}
  )
  assert again["metrics"]["uncertainty"]["scale"] == kept["scale"]
  assert again["metrics"]["uncertainty"]["calibration"] == "split-conformal"
  elsewhere = tmp_path / "elsewhere.json"
  elsewhere.write_text(json.dumps({"scale": 3.0}))  # one factor: read as a Gaussian's
  applied = data_kinds.evaluate(
    tiny_run,
    "uef2017",
    UEF,
    str(tmp_path / "e"),
    {**common, "eval.max_examples": 2, "eval.calibration": str(elsewhere)},
  )["metrics"]["uncertainty"]
  assert (applied["scale"], applied["scale_2std"], applied["calibration"]) == (3.0, 6.0, "gaussian")
  with pytest.raises(
    ValueError, match="fit_uncertainty=True fits the uncertainty scale on simulations"
  ):
    data_kinds.evaluate(
      tiny_run, "uef2017", UEF, str(tmp_path / "c"), {**common, "eval.fit_uncertainty": True}
    )
  (pathlib.Path(tiny_run) / "checkpoints" / "7" / "uncertainty.json").write_text("{}")
  with pytest.raises(ValueError, match="uncertainty.json: 'scale' must be a positive number"):
    data_kinds.evaluate(
      tiny_run, "uef2017", UEF, str(tmp_path / "d"), {**common, "eval.max_examples": 2}
    )
  (pathlib.Path(tiny_run) / "checkpoints" / "7" / "uncertainty.json").unlink()


@pytest.mark.parametrize("key, value", [("sampling.eta", float("nan")), ("sampling.eta", 1.5)])
def test_sampler_settings_out_of_range_are_named(key, value):
  with pytest.raises(ValueError, match=f"--config.{key}={value!r}: must be in \\[0, 1\\]"):
    run_opening.settings({"model": {}}, {key: value})


def _eval_cli(*args, devices=None):
  env = dict(os.environ)
  if devices:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  return subprocess.run(
    [sys.executable, str(REPO / "eval.py"), *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
  )


@pytest.mark.e2e
def test_pred_same_on_1_and_8_devices_and_uncertainty(tiny_run, tmp_path):
  """One device, 8 devices in one process, and 8 devices over 2 processes (eval.py with
  jax.distributed on 127.0.0.1) reconstruct the same images."""
  common = [
    "--workdir",
    tiny_run,
    "--data",
    "uef2017",
    "--data_path",
    UEF,
    "--config.sampling.seed=3",
    "--config.eval.figure=False",
  ]
  two = two_processes(
    "eval.py",
    *common,
    "--out",
    str(tmp_path / "two"),
    "--config.sampling.num_samples=4",
    "--config.eval.tikhonov=True",
  )
  r1 = _eval_cli(
    *common, "--out", str(tmp_path / "one"), "--config.sampling.batch_size=4", devices=1
  )
  assert r1.returncode == 0, r1.stderr[-2000:]
  assert "cdeit" in r1.stdout and "images/s" in r1.stdout
  r8 = data_kinds.evaluate(
    tiny_run,
    "uef2017",
    UEF,
    str(tmp_path / "eight"),
    {"sampling.seed": 3, "sampling.num_samples": 4, "eval.figure": False, "eval.tikhonov": True},
  )
  assert r8["devices"] == 8
  # the built-in Tikhonov baseline beside the authors' stored ones; measured cc 0.744 on these
  assert list(r8["metrics"]) == ["cdeit", "empty", "tikhonov", "TR", "xs_gn", "uncertainty"]
  assert r8["metrics"]["uncertainty"]["scale"] == 1.0  # none fitted for this step
  assert r8["metrics"]["tikhonov"]["cc"] > 0.6
  one, eight = (
    np.load(tmp_path / "one" / "predictions.npz"),
    np.load(tmp_path / "eight" / "predictions.npz"),
  )
  # sample 0 of the 4 is the single-sample run's reconstruction, example by example
  np.testing.assert_allclose(eight["samples"][0], one["pred"], atol=1e-5, rtol=0)
  assert eight["samples"].shape == (4, 22, 128, 128, 1)
  np.testing.assert_allclose(eight["pred"], eight["samples"].mean(0), atol=1e-6)
  assert eight["std"].shape == (22, 128, 128, 1) and eight["std"].mean() > 1e-3
  assert "std" not in one.files
  finish(two)
  r2 = json.loads((tmp_path / "two" / "metrics.json").read_text())
  assert (r2["processes"], r2["devices"]) == (2, 8)
  pair = np.load(tmp_path / "two" / "predictions.npz")
  for k in ("pred", "std", "samples", "target"):  # 2 x 4 devices against 1 x 8: identical
    np.testing.assert_array_equal(pair[k], eight[k], err_msg=k)
  assert pair["names"].tolist() == eight["names"].tolist()
  assert r2["metrics"] == json.loads(json.dumps(outputs.json_clean(r8["metrics"])))


def test_bad_inputs_are_named(tiny_run, fixture_run, tmp_path):
  def run(checkpoint=tiny_run, data="uef2017", data_path=UEF, out=str(tmp_path / "o"), **over):
    settings = {"eval.figure": False, "eval.max_examples": 2, **over}
    return data_kinds.evaluate(checkpoint, data, data_path, out, settings)

  with pytest.raises(ValueError, match="--data 'tank': give one of simulated, uef2017, recording"):
    run(data="tank")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="holds no .npz files"):
    run(data_path=str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="no such file or directory"):
    run(checkpoint=str(tmp_path / "missing"))
  (tmp_path / "notrun" / "checkpoints").mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="holds no finished checkpoint"):
    run(checkpoint=str(tmp_path / "notrun"))
  with pytest.raises(ValueError, match=r"--config.model.hidden_size: evaluation takes the model"):
    run(**{"model.hidden_size": 512})
  with pytest.raises(
    ValueError,
    match=r"--config.sampling.stpes=2: no such key; "
    r"config.sampling has batch_size, data_consistency",
  ):
    run(**{"sampling.stpes": 2})
  np.save(tmp_path / "mean.npy", np.zeros((1, 16, 12), np.float32))
  np.save(tmp_path / "std.npy", np.ones((1, 16, 13), np.float32))
  with pytest.raises(ValueError, match=r"mean has shape \(1, 16, 12\)"):
    run(**{"eval.stats": str(tmp_path)})
  with pytest.raises(ValueError, match="--config.eval.weights=ema"):
    run(**{"eval.weights": "raw"})
  with pytest.raises(ValueError, match=r"--config.sampling.data_consistency=-0.5: must be >= 0"):
    run(**{"sampling.data_consistency": -0.5})
  with pytest.raises(ValueError, match="--config.sampling.data_consistency_alpha=0.0: must be > 0"):
    run(**{"sampling.data_consistency": 0.5, "sampling.data_consistency_alpha": 0.0})
  # an unreadable checkpoint: corrupt metadata
  broken = tmp_path / "broken"
  import shutil

  shutil.copytree(tiny_run, broken)
  meta = broken / "checkpoints" / "7" / "meta" / "metadata"
  meta.write_text("{not json")
  with pytest.raises(ValueError, match=r"checkpoints/7/meta/metadata: unreadable: JSONDecodeError"):
    run(checkpoint=str(broken))
  # checked before any work: the example count, the output folder, data in other units
  with pytest.raises(ValueError, match=r"--config.eval.max_examples=0: must be >= 1"):
    run(**{"eval.max_examples": 0})
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(ValueError, match="a_file: exists and is not a folder"):
    run(out=str(tmp_path / "a_file"))
  if os.geteuid() != 0:  # root writes anywhere
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(ValueError, match="ro: cannot write there"):
      run(out=str(tmp_path / "ro"))
  with pytest.raises(
    ValueError,
    match="standardised in the units 'simulated', are ~.* standard deviations.*--units simulated",
  ):
    run(data="simulated")
  r = _eval_cli(
    "--workdir",
    str(tmp_path / "missing"),
    "--data",
    "uef2017",
    "--data_path",
    UEF,
    "--out",
    str(tmp_path / "o2"),
  )
  assert r.returncode == 1 and "error: checkpoint" in r.stderr and "Traceback" not in r.stderr
  r = _eval_cli(
    "--workdir",
    tiny_run,
    "--data",
    "uef2017",
    "--data_path",
    UEF,
    "--out",
    str(tmp_path / "o3"),
    "--config.sampling.stepz=2",
  )
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "error: --config.sampling.stepz: no such config key" in r.stderr


# ----------------------------------------------------------------------------- batch choice


def test_sampler_batch_is_the_largest_that_fits(monkeypatch, caplog):
  """Per-device batches 8, 4, 2, 1 are compiled in turn until the compiler's memory analysis
  fits the budget; never more than the examples need; an explicit batch is taken as given."""
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.model.diffusion import Diffusion

  mesh = shd.make_mesh()
  # big enough that activations, not code and weights, set the memory (1,024-token grid)
  model = CDEIT(
    system=system_of(),
    image_size=128,
    patch_size=4,
    hidden_size=32,
    num_heads=4,
    num_scales=2,
    rngs=nnx.Rngs(0),
  )
  graphdef, weights = nnx.split(model)
  sampler = sampling.make_sampler(graphdef, Diffusion(), 2, 1.0, (128, 128, 1), mesh)
  need = {}
  for per_device in (8, 4, 2):
    compiled, g = sampling.compile_sampler(sampler, weights, mesh, 1000, 8 * per_device)
    assert g == 8 * per_device
    need[per_device] = device_memory.memory_of(compiled)["peak_bytes"]
  assert need[8] > need[4] > need[2] > 0
  # a host whose available memory (shared by the 8 CPU devices) lies between 2 and 4 per device
  budget = 8 * (need[2] + need[4]) / 2 / 0.8
  monkeypatch.setattr(device_memory, "budget", lambda device: (budget, 8))
  with caplog.at_level(logging.INFO, logger="cdeit_jax"):
    assert sampling.compile_sampler(sampler, weights, mesh, 1000)[1] == 16
  tried = [r.getMessage() for r in caplog.records if r.name == "cdeit_jax.eval"]
  assert len(tried) == 2 and "trying a smaller batch" in tried[0]
  monkeypatch.setattr(device_memory, "budget", lambda device: (1e15, 8))
  assert sampling.compile_sampler(sampler, weights, mesh, 1000)[1] == 64
  assert sampling.compile_sampler(sampler, weights, mesh, 10)[1] == 16  # 10 examples: 2 each
  with pytest.raises(
    ValueError, match="--config.sampling.batch_size=12: must be a positive multiple of the 8"
  ):
    sampling.compile_sampler(sampler, weights, mesh, 1000, 12)


def test_memory_budget_on_cpu_is_the_hosts_available_memory():
  """Available memory lies between the free and the total physical memory, as the C library
  reports them (sysconf), and the 8 local CPU devices share it."""
  budget, sharing = device_memory.budget(jax.devices()[0])
  page = os.sysconf("SC_PAGE_SIZE")
  free, total = os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
  assert sharing == 8
  assert 0.9 * free <= budget <= total


# make test-all: a measurement (36 s); reconstruct's is bench/bench_reconstruct_memory.py
@pytest.mark.slow
def test_memory_stays_flat_as_the_test_set_grows(tiny_run, tmp_path, monkeypatch):
  """Examples are sampled, scored and written a chunk at a time: after a warm-up run (compiles
  and caches out of the count), numpy's peak allocation (tracemalloc) grows from 64 to 256
  examples by less than half of what holding the 192 extra examples' saved arrays would take
  (their bytes in predictions.npz); the metrics equal `metrics.score` over the whole saved arrays
  at once; the first 64 reconstructions are the 64-example run's; the .mat holds the npz's
  arrays."""
  import tracemalloc

  from cdeit_jax.data import npz_files

  big = tmp_path / "big"
  big.mkdir()
  names = npz_files.list_files(UEF)
  for i in range(256):
    os.link(os.path.join(UEF, names[i % len(names)]), big / f"{i:04d}_{names[i % len(names)]}")
  settings = {
    "sampling.num_samples": 2,
    "sampling.steps": 1,
    "eval.figure": False,
    "sampling.batch_size": 16,
  }
  monkeypatch.setattr(evaluate, "CHUNK", 32)  # 2 and 8 chunks: both hold two chunks at a time
  peaks = {}
  for n in (32, 64, 256):  # 32: the warm-up
    tracemalloc.start()
    r = data_kinds.evaluate(
      tiny_run, "uef2017", str(big), str(tmp_path / str(n)), {**settings, "eval.max_examples": n}
    )
    peaks[n] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
  with np.load(tmp_path / "256" / "predictions.npz") as z:
    held = sum(z[k].nbytes for k in z.files) * 192 / 256
  assert peaks[256] - peaks[64] < 0.5 * held, (peaks, held)
  z = np.load(tmp_path / "256" / "predictions.npz")
  report, _, _ = metrics.score(z["pred"][..., 0], z["target"][..., 0], {})
  for k in ("rmse", "psnr", "ssim", "ssim_disk", "cc"):
    assert r["metrics"]["cdeit"][k] == pytest.approx(report["cdeit"][k], rel=1e-9), k
  u = intervals.coverage(z["pred"][..., 0], z["samples"].std(0)[..., 0], z["target"][..., 0])
  assert r["metrics"]["uncertainty"] == pytest.approx(u, rel=1e-9)
  z64 = np.load(tmp_path / "64" / "predictions.npz")
  np.testing.assert_array_equal(z["pred"][:64], z64["pred"])  # chunked alike or not
  assert z["names"].tolist() == sorted(os.listdir(big))
  mat = mat73.loadmat(tmp_path / "256" / "predictions.mat")
  np.testing.assert_allclose(mat["pred"], z["pred"][..., 0] * 2 / 1040.856, rtol=1e-6)
  np.testing.assert_allclose(mat["std"], z["std"][..., 0] * 2 / 1040.856, rtol=1e-6)
  np.testing.assert_array_equal(mat["target"], z["target"][..., 0])
  assert mat["names"] == z["names"].tolist()
