"""`python -m cdeit_jax.simulate`: layout, determinism, extension, statistics."""

import dataclasses
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cdeit_jax import config_lib, simulate
from cdeit_jax.data import sources, synthetic
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.eit import tikhonov
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sim(seed):
  """The default simulated distribution (config.simulator) with another seed."""
  c = config_lib.default_config().simulator
  c.seed = seed
  return c


def read_split(path):
  files = sorted(glob.glob(os.path.join(path, "*.npz")))
  return [os.path.basename(f) for f in files], [dict(np.load(f)) for f in files]


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("sim") / "a")
  r = simulate.generate(
    out, {"train": 12, "valid": 4, "test": 2}, sim(5), batch_size=8, progress=False
  )
  assert r["generated"] == 18
  return out


def test_layout_and_loader(small_set):
  names, ex = read_split(os.path.join(small_set, "train"))
  assert names == [f"{i:07d}.npz" for i in range(12)]
  assert ex[0]["ys"].shape == (208, 1) and ex[0]["ys"].dtype == np.float32
  assert ex[0]["xs"].shape == (128, 128) and ex[0]["TR"].shape == (128, 128)
  assert all(np.abs(e["xs"]).max() > 0 for e in ex)
  # TR is the default Tikhonov applied to ys
  np.testing.assert_allclose(
    ex[3]["TR"], tikhonov.default_tikhonov(CDEIT16)(ex[3]["ys"]), atol=1e-5
  )
  # the stats are the training split's, and the project's loader reads the folder
  mean, std = stats_lib.compute_stats(os.path.join(small_set, "train"), progress=False)
  np.testing.assert_array_equal(np.load(os.path.join(small_set, "std.npy")), std)
  ys = np.stack([e["ys"][:, 0] for e in ex]).astype(np.float64)
  np.testing.assert_allclose(std.ravel(), ys.std(0, ddof=1), rtol=1e-5)
  src = sources.NpzSource(os.path.join(small_set, "valid"), "simulated", baselines=True)
  assert len(src) == 4 and np.isfinite(src[0]["TR"]).all()


def test_same_seed_same_bytes_and_extension(small_set, tmp_path):
  """Another batch size, in two runs (the second extends the first), gives the same examples."""
  out = str(tmp_path / "b")
  simulate.generate(out, {"train": 5}, sim(5), batch_size=4, progress=False)
  r = simulate.generate(
    out, {"train": 12, "valid": 4, "test": 2}, sim(5), batch_size=4, progress=False
  )
  assert r["generated"] == 13  # only the missing ones
  for split in ("train", "valid", "test"):
    na, ea = read_split(os.path.join(small_set, split))
    nb, eb = read_split(os.path.join(out, split))
    assert na == nb
    for a, b in zip(ea, eb):
      np.testing.assert_array_equal(a["xs"], b["xs"])
      np.testing.assert_allclose(a["ys"], b["ys"], rtol=0, atol=1e-6 * np.abs(a["ys"]).max())
  # a second identical run changes nothing
  assert simulate.generate(out, {"train": 12}, sim(5), progress=False)["generated"] == 0
  # another seed: other examples
  other = str(tmp_path / "c")
  simulate.generate(other, {"train": 2}, sim(6), progress=False)
  assert not np.array_equal(
    read_split(os.path.join(other, "train"))[1][0]["xs"],
    read_split(os.path.join(out, "train"))[1][0]["xs"],
  )


def test_files_are_the_simulator_sources_examples(small_set):
  """File i of a split is example i of that split as the simulator data source makes it on the
  devices (8 here, the command used 1), bit for bit."""
  import jax

  from cdeit_jax.common import sharding as shd

  _, ex = read_split(os.path.join(small_set, "valid"))
  ys, xs = synthetic.example_arrays(sim(5), "valid", np.arange(4), shd.make_mesh(jax.devices()))
  for i in range(4):
    np.testing.assert_array_equal(ex[i]["ys"][:, 0], ys[i])
    np.testing.assert_array_equal(ex[i]["xs"], xs[i])


def test_class_targets_are_the_label_targets_over_each_objects_label(small_set):
  """phantom.target="class": the same voltages, bit for bit, and each object drawn at +-1: the
  label image divided, object by object (connected pixels, scipy), by its largest |value| (an
  interior pixel's label)."""
  import jax
  from scipy import ndimage

  from cdeit_jax.common import sharding as shd

  mesh = shd.make_mesh(jax.devices())
  ys, xs = synthetic.example_arrays(sim(5), "valid", np.arange(4), mesh)
  c = sim(5)
  c.phantom.target = "class"
  ys_c, xs_c = synthetic.example_arrays(c, "valid", np.arange(4), mesh)
  np.testing.assert_array_equal(ys_c, ys)
  for x, x_c in zip(np.asarray(xs), np.asarray(xs_c)):
    objects, n = ndimage.label(x != 0, structure=np.ones((3, 3)))
    assert n >= 1 and np.abs(x).max() < 1 - 1e-3  # labels in +-[0.5, 1]: not a class map
    expected = x.copy()
    for k in range(1, n + 1):
      expected[objects == k] /= np.abs(x[objects == k]).max()
    np.testing.assert_allclose(x_c, expected, atol=1e-6)
    assert set(np.unique(np.sign(x_c))) <= {-1, 0, 1} and np.abs(x_c).max() == 1


def test_refuses_to_mix_settings(small_set):
  with pytest.raises(ValueError, match=r"seed: folder has 5, asked 6"):
    simulate.generate(small_set, {"train": 30}, sim(6), progress=False)


@pytest.mark.slow  # make test-all: 30 s; folders of an older layout
def test_folders_from_before_phantom_target_extend_with_label_targets_only(small_set, tmp_path):
  """simulate.json records `phantom.target` only when it is "class": a folder written before the
  key existed (label targets) still extends, and is refused for class targets."""
  import shutil

  out = tmp_path / "before"
  shutil.copytree(small_set, out)
  record = json.loads((out / "simulate.json").read_text())
  assert "target" not in record["phantom"]
  simulate.generate(str(out), {"train": 13}, sim(5), progress=False)
  assert len(os.listdir(out / "train")) == 13
  c = sim(5)
  c.phantom.target = "class"
  with pytest.raises(ValueError, match=r"phantom: folder has .*, asked .*'target': 'class'"):
    simulate.generate(str(out), {"train": 14}, c, progress=False)
  (tmp_path / "class").mkdir()
  simulate.generate(str(tmp_path / "class"), {"train": 1}, c, progress=False)
  assert json.loads((tmp_path / "class" / "simulate.json").read_text())["phantom"]["target"] == (
    "class"
  )


@pytest.mark.slow  # 40 s; a folder from before the phantom target extends by default (above)
def test_folders_from_before_the_drift_and_resistive_range_extend_without_them(small_set, tmp_path):
  """simulate.json records `system.drift` and `phantom.resistive_v_min/max` only when they are
  used: a folder written before they existed still extends, and is refused for either."""
  import shutil

  out = tmp_path / "before"
  shutil.copytree(small_set, out)
  record = json.loads((out / "simulate.json").read_text())
  assert "drift" not in record["system"] and "resistive_v_min" not in record["phantom"]
  simulate.generate(str(out), {"train": 13}, sim(5), progress=False)
  assert len(os.listdir(out / "train")) == 13
  drifting, resistive = sim(5), sim(5)
  drifting.system.drift = (0.9, 1.1)
  resistive.phantom.update(resistive_v_min=1.5, resistive_v_max=3.0)
  with pytest.raises(ValueError, match=r"system: folder has .*, asked .*'drift': \[0.9, 1.1\]"):
    simulate.generate(str(out), {"train": 14}, drifting, progress=False)
  with pytest.raises(ValueError, match=r"phantom: folder has .*, asked .*'resistive_v_min': 1.5"):
    simulate.generate(str(out), {"train": 14}, resistive, progress=False)


def test_refuses_folders_of_unknown_settings_and_records_tr_splits(small_set, tmp_path):
  import shutil

  bare = tmp_path / "bare"
  shutil.copytree(small_set, bare)
  os.remove(bare / "simulate.json")  # examples whose settings nobody recorded
  with pytest.raises(ValueError, match="holds examples .* but no simulate.json"):
    simulate.generate(str(bare), {"train": 30}, sim(5), progress=False)
  assert json.load(open(os.path.join(small_set, "simulate.json")))["tr_splits"] == [
    "test",
    "train",
    "valid",
  ]
  with pytest.raises(
    ValueError,
    match=r"tr_splits: folder has \['test', 'train', 'valid'\], "
    r"asked \['test'\]",
  ):
    simulate.generate(small_set, {"train": 30}, sim(5), tr_splits=("test",), progress=False)


@pytest.mark.slow  # 15 s; test_same_seed_same_bytes_and_extension covers extending
def test_extension_replaces_statistics_even_after_a_kill(tmp_path):
  """New training files remove the old mean/std before the first write, so a run killed before
  recomputing them leaves none (the next run computes them) rather than stale ones."""
  out = str(tmp_path / "s")
  simulate.generate(out, {"train": 3}, sim(5), progress=False)
  old = np.load(os.path.join(out, "std.npy"))
  calls = []
  real = stats_lib.compute_stats

  def killed(*a, **k):
    calls.append(1)
    raise KeyboardInterrupt  # the kill, after the new files and before the statistics

  stats_lib.compute_stats = killed
  try:
    with pytest.raises(KeyboardInterrupt):
      simulate.generate(out, {"train": 6}, sim(5), progress=False)
  finally:
    stats_lib.compute_stats = real
  assert calls and not os.path.exists(os.path.join(out, "std.npy"))
  assert simulate.generate(out, {"train": 6}, sim(5), progress=False)["generated"] == 0
  mean, std = stats_lib.compute_stats(os.path.join(out, "train"), progress=False)
  np.testing.assert_array_equal(np.load(os.path.join(out, "std.npy")), std)
  assert not np.array_equal(std, old)


@pytest.mark.parametrize(
  "key, value, match",
  [
    ("snr_db", float("nan"), "snr_db=nan: give a finite number of dB"),
    ("phantom.min_aspect", -1.0, "need 0 < min_aspect <= 1"),
    ("phantom.annulus_inner", 1.5, "need 0 < annulus_inner < 1"),
    ("phantom.target", "labels", "target='labels': give one of label, class"),
  ],
)
def test_nonsense_settings_are_named(key, value, match):
  cfg = config_lib.default_config()
  config_lib.override(cfg, {f"simulator.{key}": value})
  with pytest.raises(ValueError, match=match):
    synthetic.settings_json(cfg.simulator)


@pytest.mark.e2e
def test_cli_errors_name_the_flag(tmp_path):
  run = lambda *a: subprocess.run(
    [sys.executable, "-m", "cdeit_jax.simulate", "--out", str(tmp_path / "x"), *a],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  r = run("--num_train", "2", "--config.simulator.phantom.max_inclusion=2")
  assert (
    r.returncode == 2
    and "--config.simulator.phantom.max_inclusion: no such config key" in r.stderr
    and "(did you mean simulator.phantom.max_inclusions?)" in r.stderr
  )
  r = run("--num_train", "2", "--tr_splits", "train,tst")
  assert r.returncode == 1 and "--tr_splits: unknown splits ['tst']" in r.stderr
  r = run("--num_train", "2", "--config.simulator.phantom.max_size=0.99")
  assert r.returncode == 1 and "max_size < max_radius" in r.stderr


@pytest.mark.slow  # 19 s; the simulator's physics is checked against EIDORS by default
def test_training_statistics_have_the_authors_magnitudes(tmp_path):
  """256 examples of the default recipe, made by the CLI: median std within 2x of the authors'
  1.0e-5 V. (A subprocess with its own host devices, one per core, as the command sets them.)"""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "cdeit_jax.simulate",
      "--out",
      str(tmp_path / "s"),
      "--num_train",
      "256",
      "--batch_size",
      "128",
      "--tr_splits",
      "",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert "generated 256 examples" in r.stdout
  std = np.load(tmp_path / "s" / "std.npy").ravel()
  authors = np.load(os.path.join(REPO, "cdeit_jax", "assets", "std.npy")).ravel()
  assert np.median(authors) == pytest.approx(1.0e-5, rel=0.05)
  assert 0.5 < np.median(std) / np.median(authors) < 2.0
  assert 0.25 < std.max() / authors.max() < 4.0
  assert "TR" not in np.load(tmp_path / "s" / "train" / "0000000.npz").files


def _config(name):
  return config_lib.load(os.path.join(REPO, "configs", name))


def test_foreign_config_is_one_system_the_default_draws_one_per_example():
  """configs/foreign.py: every example is measured by the same device (32 electrodes, 16 of
  them passive, off the training distribution's centre); the default draws a system per
  example; the nominal spec takes the fixed system's fast path."""
  import jax

  keys = jax.random.split(jax.random.key(0), 4)
  foreign = synthetic.generator(_config("foreign.py").simulator)
  f = {k: np.asarray(v) for k, v in dataclasses.asdict(foreign.systems(keys)).items()}
  for v in f.values():
    np.testing.assert_array_equal(v, np.broadcast_to(v[:1], v.shape))
  # one device, but each measurement drifts on its own (a drift range given)
  drifting = _config("foreign.py").simulator
  drifting.system.drift = (0.9, 1.1)
  g = {
    k: np.asarray(v)
    for k, v in dataclasses.asdict(synthetic.generator(drifting).systems(keys)).items()
  }
  for k, v in g.items():
    if k != "drift":
      np.testing.assert_array_equal(v, f[k])
  assert len(set(g["drift"])) == 4 and np.all(np.abs(g["drift"] - 1) <= 0.1 + 1e-6)
  assert f["centres"].shape == (4, 32) and np.all(f["weights"][0] > 0)  # passive present
  assert f["gain"][0] == pytest.approx(1.3 / 0.9, rel=1e-6)
  default = synthetic.generator(config_lib.default_config().simulator)
  d = {k: np.asarray(v) for k, v in dataclasses.asdict(default.systems(keys)).items()}
  assert not foreign.nominal and not default.nominal
  assert len({tuple(row) for row in d["centres"]}) == 4 and len(set(d["gain"])) == 4
  nominal = config_lib.default_config().simulator
  from cdeit_jax.eit.spec import SystemSpec

  nominal.system.update(dataclasses.asdict(SystemSpec.nominal()))
  assert synthetic.Generator(nominal).nominal


def test_format_2_folders_are_refused_with_a_reason(tmp_path):
  out = tmp_path / "old"
  out.mkdir()
  (out / "simulate.json").write_text(json.dumps({"format": 2, "seed": 0}))
  with pytest.raises(ValueError, match="format 2: four phantom kinds .* its files still load"):
    simulate.generate(str(out), {"train": 2}, sim(0), progress=False)


def test_huge_counts_start_at_once():
  """`--num_train 100000000`: the work list is lazy (its first chunk comes without listing 10^8
  indices), skipping the files that exist."""
  chunks = simulate._missing(10**8, {0, 2, 5}, 3)
  assert next(chunks).tolist() == [1, 3, 4] and next(chunks).tolist() == [6, 7, 8]
  assert [c.tolist() for c in simulate._missing(7, {0, 2, 5}, 3)] == [[1, 3, 4], [6]]
