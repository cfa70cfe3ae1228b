"""A CDEIT for any measuring system: the linear-reconstruction condition of a layout's values
with removed electrodes, its data (npz files of R values, statistics), training with removals
drawn per example, evaluation on simulations and in KTC2023's folders, refusals of another
system's data."""

import json
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.io
from conftest import DEVICE_MODEL, SKIP2, challenge_folder, device_file, system_of

from cdeit_jax.common.errors import InputError
from cdeit_jax.data import npz_files
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.eit import conditioning, tikhonov
from cdeit_jax.eit import layout as lay

REPO = pathlib.Path(__file__).parent.parent
LEVELS = REPO / "data" / "ktc2023" / "levels"


def test_the_condition_is_tikhonov_of_the_values_each_removal_leaves():
  """For every electrode set of a removal rule, the conditioner's coarse reconstruction of a
  frame missing that set's values equals a Tikhonov/NOSER matrix built the other way (the
  explicit inverse of `eit.tikhonov.Tikhonov`) from the Jacobian's rows that are left; a frame
  missing other values gets NaN, and `removal_set` names it."""
  rule = "-;3;0,1,2,3"
  c = conditioning.LayoutConditioner("cdeit16", (0.1, 1.0), removals=rule, grid=16)
  layout = lay.preset("cdeit16")
  jac = conditioning.pooled_jacobian(tikhonov.layout_jacobian(layout), 16)
  rng = np.random.default_rng(0)
  frames = rng.standard_normal((3, layout.num_values)).astype(np.float32) * 1e-3
  for k, electrodes in enumerate(lay.removal_sets(rule)):
    gone = layout.without(electrodes)
    # by hand: electrode 3 drives 2 patterns (26 values); pairs (2,3), (3,4) are measured by 12
    # patterns twice and by 2 once (26); 0-3 drive 5 patterns (65); the 5 pairs touching them
    # are measured 4 times by 2 patterns and 5 times by 9 (53)
    assert gone.sum() == [0, 52, 118][k]
    cond = np.where(gone, np.nan, frames)
    got = np.asarray(c.coarse(jnp.asarray(cond), scaled=False))  # (3, 2, disk pixels)
    for a, alpha in enumerate((0.1, 1.0)):
      want = tikhonov.Tikhonov(jac=jac[~gone], alpha=alpha)(frames[:, ~gone])
      want = want.reshape(3, -1)[:, conditioning.ph.disk_mask(16).reshape(-1)]
      # float32 matrices whose entries are ~200x the images: 2e-3 of the largest pixel (a wrong
      # row, set or lambda is off by tens of percent)
      np.testing.assert_allclose(got[:, a], want, rtol=0, atol=5e-3 * np.abs(want).max())
    assert np.array_equal(conditioning.removal_set(c.removed[...], cond, "x"), [k] * 3)
  odd = frames.copy()
  odd[:, 5] = np.nan  # one value missing: no electrode set loses only it
  assert np.isnan(np.asarray(c.coarse(jnp.asarray(odd)))).all()
  with pytest.raises(InputError, match=r"frames.mat: frame 0 misses 1 values, which is none"):
    conditioning.removal_set(c.removed[...], odd, "frames.mat")
  drawn = np.asarray(c.remove_at_random(jnp.asarray(np.repeat(frames, 100, 0)), _key(1)))
  kinds = {tuple(np.isnan(row)) for row in drawn}
  assert kinds == {tuple(layout.without(s)) for s in lay.removal_sets(rule)}


def _hand_laplacian(grid: int) -> np.ndarray:
  """The disk pixels' 4-neighbour graph Laplacian, pixel by pixel."""
  disk = conditioning.ph.disk_mask(grid)
  where = {ij: n for n, ij in enumerate(zip(*np.nonzero(disk)))}
  lap = np.zeros((len(where),) * 2)
  for (i, j), n in where.items():
    for nb in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)):
      if nb in where:
        lap[n, where[nb]] = -1.0
        lap[n, n] += 1.0
  return lap


def test_each_prior_is_its_regularised_least_squares():
  """`cond_priors`: one channel per prior and level, prior-major, each the minimiser of its
  own objective for the values a set leaves: NOSER against eit.tikhonov's explicit inverse,
  Laplace against a stacked least-squares solve with a Laplacian built pixel by pixel, the
  Gaussian prior against its posterior mean written out with a covariance built point by point."""
  rule, alphas = "-;3", (0.1, 1.0)
  priors = ("noser", "laplace", "smooth")
  c = conditioning.LayoutConditioner("cdeit16", alphas, removals=rule, grid=16, priors=priors)
  assert c.num_channels == 6
  layout = lay.preset("cdeit16")
  jac = conditioning.pooled_jacobian(tikhonov.layout_jacobian(layout), 16)
  disk = conditioning.ph.disk_mask(16)
  lap = _hand_laplacian(16)
  centres = [((j + 0.5) / 8 - 1, (i + 0.5) / 8 - 1) for i, j in zip(*np.nonzero(disk))]
  cov = np.array(
    [
      [np.exp(-((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) / (2 * 0.2**2)) for b in centres]
      for a in centres
    ]
  )
  frames = np.random.default_rng(2).standard_normal((2, layout.num_values)) * 1e-3
  for electrodes in lay.removal_sets(rule):
    gone = layout.without(electrodes)
    got = np.asarray(
      c.coarse(jnp.asarray(np.where(gone, np.nan, frames), jnp.float32), scaled=False)
    )
    j = jac[~gone].reshape(int((~gone).sum()), -1)[:, disk.reshape(-1)]
    y = frames[:, ~gone].T
    for a, alpha in enumerate(alphas):
      want = {
        "noser": tikhonov.Tikhonov(jac=jac[~gone], alpha=alpha)(frames[:, ~gone]).reshape(2, -1)[
          :, disk.reshape(-1)
        ],
        "laplace": np.linalg.lstsq(
          np.vstack([j, np.sqrt(alpha * np.trace(j.T @ j) / np.trace(lap.T @ lap)) * lap]),
          np.vstack([y, np.zeros((len(lap), 2))]),
          rcond=None,
        )[0].T,
        "smooth": (
          cov
          @ j.T
          @ np.linalg.solve(
            j @ cov @ j.T + alpha * np.trace(j @ cov @ j.T) / len(j) * np.eye(len(j)), y
          )
        ).T,
      }
      for p, prior in enumerate(priors):
        w = want[prior]
        # float32 matrices (a wrong prior, level or order is off by tens of percent)
        np.testing.assert_allclose(
          got[:, p * len(alphas) + a], w, rtol=0, atol=5e-3 * np.abs(w).max(), err_msg=prior
        )
  for bad in (("noser", "noser"), ("tv",), ()):
    with pytest.raises(InputError, match="config.model.cond_priors"):
      conditioning.LayoutConditioner("cdeit16", alphas, priors=bad)
  from cdeit_jax.model.network import CDEIT

  with pytest.raises(InputError, match="config.model.cond_priors"):
    CDEIT(system=system_of("eim+linear"), cond_priors=("laplace",), hidden_size=8, rngs=_rngs())


def test_the_removal_set_as_an_input():
  """`removal_input=True`: a frame's set (as `removal_set` finds it from its NaNs) selects a
  learnt vector beside the timestep's; with that vector zero the network is the one without
  it, and a vector set for one set changes only that set's frames."""
  from flax import nnx

  from cdeit_jax.model.network import CDEIT

  rule = "-;3;0,1,2,3"
  kw = dict(
    system=system_of("linear", "cdeit16", rule, "classes"),
    cond_grid=16,
    patch_size=16,
    hidden_size=16,
    num_heads=2,
    num_scales=1,
  )
  plain, embedded = CDEIT(**kw, rngs=_rngs()), CDEIT(**kw, removal_input=True, rngs=_rngs())
  layout = lay.preset("cdeit16")
  frames = np.random.default_rng(3).standard_normal((6, layout.num_values)).astype(np.float32)
  sets = np.array([0, 1, 2, 2, 1, 0])
  gone = np.stack([layout.without(s) for s in lay.removal_sets(rule)])
  cond = jnp.asarray(np.where(gone[sets], np.nan, frames))
  assert np.array_equal(np.asarray(embedded.conditioner.set_index(cond)), sets)
  assert np.array_equal(conditioning.removal_set(gone, np.asarray(cond), "x"), sets)
  # random weights (adaLN-zero starts every block's modulation, so any input vector, at zero)
  import jax

  params = nnx.state(plain, nnx.Param)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(_key(4), len(leaves))
  noise = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  nnx.update(plain, jax.tree.unflatten(tree, noise))
  nnx.update(embedded, nnx.state(plain, nnx.Param))  # the same weights but the vectors
  embedded.removal_embed.embedding[...] = jnp.zeros_like(embedded.removal_embed.embedding[...])
  base = np.asarray(plain.segment(cond))
  np.testing.assert_array_equal(np.asarray(embedded.segment(cond)), base)
  embedded.removal_embed.embedding[...] = embedded.removal_embed.embedding[...].at[1].set(0.5)
  moved = np.asarray(embedded.segment(cond))
  changed = np.abs(moved - base).reshape(6, -1).max(1) > 1e-4
  assert np.array_equal(changed, sets == 1)
  with pytest.raises(InputError, match="config.model.removal_input"):
    CDEIT(system=system_of("linear", "cdeit16"), hidden_size=8, removal_input=True, rngs=_rngs())


def test_dropping_the_values_on_current_carrying_electrodes():
  """`current_carrying="drop"` reconstructs a skip-2 device that measures all 16 pairs (256
  values) exactly as a conditioner of the same device without those pairs does (from_rules'
  192, a second implementation), with or without a removal set; whatever a frame holds there
  changes nothing; a frame missing them is read the same; the EIM model refuses the setting."""
  full = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  carry = full.on_current_carrying
  # by hand: electrodes k and k+3 carry current; 4 of the 16 adjacent pairs touch them
  assert carry.sum() == 16 * 4
  short = lay.from_rules(16, injection="skip-2")
  assert np.array_equal(full.rows[~carry], short.rows)
  assert not lay.preset("cdeit16").on_current_carrying.any()
  rule = "-;3"
  drop = conditioning.LayoutConditioner(
    full, (0.1,), removals=rule, grid=16, current_carrying="drop"
  )
  other = conditioning.LayoutConditioner(short, (0.1,), removals=rule, grid=16)
  frames = np.random.default_rng(1).standard_normal((3, full.num_values)).astype(np.float32)
  for electrodes in lay.removal_sets(rule):
    cond = np.where(full.without(electrodes), np.nan, frames)
    got = np.asarray(drop.coarse(jnp.asarray(cond), scaled=False))
    want = np.asarray(other.coarse(jnp.asarray(cond[:, ~carry]), scaled=False))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    for held in (np.float32(1e4), np.float32(np.nan)):
      odd = np.where(carry & ~full.without(electrodes), held, cond)
      np.testing.assert_array_equal(np.asarray(drop.coarse(jnp.asarray(odd), scaled=False)), got)
  with pytest.raises(InputError, match="config.model.current_carrying"):
    conditioning.LayoutConditioner(full, (0.1,), current_carrying="some")
  from cdeit_jax.model.network import CDEIT

  with pytest.raises(InputError, match="config.model.current_carrying"):
    CDEIT(system=system_of("eim+linear", current_carrying="drop"), hidden_size=8, rngs=_rngs())


def _rngs():
  from flax import nnx

  return nnx.Rngs(0)


def _key(seed):
  import jax

  return jax.random.key(seed)


def test_removal_rules_and_their_refusals():
  assert lay.removal_sets("none") == ((),)
  assert lay.removal_sets("ktc2023")[2] == (0, 1, 2, 3)
  assert lay.removal_sets("-;4,3") == ((), (3, 4))
  for bad in ("", "a;b", "-;-", "3;-1"):
    with pytest.raises(InputError, match="config.simulator.removals"):
      lay.removal_sets(bad)
  with pytest.raises(InputError, match=r"electrodes \[16\] are not among cdeit16"):
    conditioning.LayoutConditioner("cdeit16", (0.1,), removals="-;16")


def test_statistics_and_files_of_another_count_of_values(tmp_path):
  """Statistics of R != 208 values are kept as (1, R); data of another count than the
  system's are refused naming the file and both counts."""
  mean, std = stats_lib.check_stats(np.zeros(256), np.ones(256))
  assert mean.shape == std.shape == (1, 256)
  with pytest.raises(InputError, match="differ in shape"):
    stats_lib.check_stats(np.zeros(256), np.ones((1, 256)))
  with pytest.raises(InputError, match="hold 256 values, the data 2356"):
    stats_lib.check_count(mean, 2356, "DATA/train")
  for i, r in enumerate((256, 256, 208)):
    np.savez(tmp_path / f"{i}.npz", ys=np.zeros((r, 1)), xs=np.zeros((128, 128)))
  with pytest.raises(npz_files.DatasetError, match=r"2.npz: ys has shape \(208, 1\), expected"):
    npz_files.check_folder(str(tmp_path), ["0.npz", "1.npz", "2.npz"], num_values=256)


def _run(*args, timeout=900):
  p = subprocess.run(
    [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=timeout
  )
  assert p.returncode == 0, p.stderr[-4000:]
  return p


def _skip2_pipeline(tmp_path, num_train: int, steps: int, model: dict):
  """A 16-electrode skip-2 device (counter-clockwise, measuring on its current-carrying
  electrodes; KTC's keys) as `config.simulator.layout`, trained with electrode 3 removed or not
  (removals '-;3'): simulate, train, then eval.py on held-out simulations at both removal sets.
  Returns (workdir, device file, {removal: metrics})."""
  layout = lay.from_rules(16, **SKIP2)
  device = tmp_path / "device.mat"
  device_file(device, layout)
  data, run = tmp_path / "data", tmp_path / "run"
  cfg = [
    "--config",
    REPO / "configs" / "ktc2023.py",
    f"--config.simulator.layout={device}",
    "--config.simulator.removals=-;3",
    "--config.simulator.contact_impedance=0.05",
  ]
  counts = [f"--num_train={num_train}", "--num_valid=8", "--num_test=32", "--tr_splits=test"]
  _run("-m", "cdeit_jax.simulate", *cfg, f"--out={data}", *counts)
  assert json.loads((data / "simulate.json").read_text())["layout"] == str(device)
  assert np.load(data / "mean.npy").shape == (1, 256)
  train = [f"--config.model.{k}={v}" for k, v in model.items()] + [
    f"--config.data.path={data}",
    f"--config.steps={steps}",
    f"--config.eval_every={steps}",
    "--config.log_every=1",
  ]
  _run("train.py", *cfg, f"--workdir={run}", *train)
  results = {}
  for removal in (0, 1):
    out = tmp_path / f"eval_{removal}"
    _run(
      "eval.py",
      f"--workdir={run}",
      "--data=simulated",
      f"--data_path={data / 'test'}",
      f"--out={out}",
      "--config.eval.tikhonov=True",
      f"--config.eval.removal={removal}",
      "--config.eval.figure=False",
    )
    results[removal] = json.loads((out / "metrics.json").read_text())["metrics"]
  return run, device, results, layout


def test_a_tiny_model_for_another_device_in_one_process(device_run, tmp_path):
  """In-process and tiny (`device_run`): the device's simulations and statistics (256 values),
  the train step with the removal drawn per example (finite loss; the NaN values never reach
  the network), the checkpoint, eval.py's simulated path at removal 1 (CDEIT beside the
  Tikhonov of the 208 values left), the challenge path writing answers, and KTC2023's data
  refused naming both systems."""
  from cdeit_jax.infer import challenge, data_kinds

  d = device_run
  assert d.train.mean.shape == (1, 256) and d.train[0]["cond"].shape == (256,)
  assert bool(d.metrics["finite"]) and int(d.state.step) == 1
  assert d.model.removes_values and d.model.x_embedder.kernel.shape[2] == 1 + 2  # x + 2 levels
  out = tmp_path / "eval"
  common = {"sampling.num_samples": 1, "eval.tikhonov": True, "eval.figure": False}
  data_kinds.evaluate(
    d.run, "simulated", str(d.data / "test"), str(out), common | {"eval.removal": 1}
  )
  r = json.loads((out / "metrics.json").read_text())
  assert {"cdeit", "tikhonov", "empty"} <= set(r["metrics"]) and "TR" not in r["metrics"]
  assert r["settings"]["config"]["eval"]["removal"] == 1
  levels = tmp_path / "levels"
  challenge_folder(levels / "level_2", d.layout, [3])
  rule = {"sampling.num_samples": 4, "eval.answer_rule": "vote:0.05:0.5"}
  m = challenge.evaluate(d.run, str(levels), str(tmp_path / "answers"), common | rule)
  assert set(m["metrics"]) == {"cdeit", "tikhonov", "water"} and "| cdeit |" in m["table"]
  assert m["settings"]["answer_rule"] == "vote:0.05:0.5" and m["settings"]["num_samples"] == 4
  written = scipy.io.loadmat(tmp_path / "answers" / "level_2" / "1.mat")
  answer, p_res, p_con = (written[k] for k in ("reconstruction", "p_resistive", "p_conductive"))
  assert answer.shape == (256, 256) and set(np.unique(answer)) <= {0, 1, 2}
  assert (answer > 0).any()  # the tiny model's samples pass 0.05 somewhere
  # the written fractions are of 4 samples, and the answer is their vote
  assert set(np.unique(np.concatenate([p_res, p_con]))) <= {0, 0.25, 0.5, 0.75, 1}
  np.testing.assert_array_equal(answer == 2, (p_con >= 0.5) & (p_con > p_res))
  np.testing.assert_array_equal(answer == 1, (p_res >= 0.5) & (p_res > p_con))
  words = r"the data are of ktc2023 .*\(32 electrodes.*trained for device.mat .*\(16 electrodes"
  with pytest.raises(InputError, match=words):
    challenge.evaluate(d.run, str(LEVELS / "level_1"), str(tmp_path / "no"), common)
  assert not (tmp_path / "no").exists()


@pytest.mark.slow  # 2.5 minutes on 2 cores (eight commands)
def test_a_model_for_another_device_trains_evaluates_and_refuses_other_systems(tmp_path):
  """The whole path for a device that is not CDEIT's, tiny: its simulations (256 values per
  file), training with its removal set drawn per example, eval.py on held-out simulations with
  and without the removed electrode (CDEIT beside the Tikhonov of the same values), its
  challenge-style folders answered; KTC2023's data, and a frame missing another electrode, are
  refused in one line that names what fits and what does not, leaving no --out."""
  run, device, results, layout = _skip2_pipeline(tmp_path, 24, 2, DEVICE_MODEL)
  for removal in (0, 1):
    assert {"cdeit", "tikhonov"} <= set(results[removal]), results[removal].keys()
  # the Tikhonov baseline of removal 1 is made from the 208 values left, and differs
  assert results[0]["tikhonov"]["rmse"] != results[1]["tikhonov"]["rmse"]
  levels = tmp_path / "levels"
  challenge_folder(levels / "level_1", layout, [])
  challenge_folder(levels / "level_2", layout, [3])
  out = tmp_path / "answers"
  common = ["eval.py", f"--workdir={run}", "--data=ktc2023_challenge"]
  p = _run(*common, f"--data_path={levels}", f"--out={out}", "--config.eval.tikhonov=True")
  r = json.loads((out / "metrics.json").read_text())["metrics"]
  assert set(r) == {"cdeit", "tikhonov", "water"} and "| cdeit |" in p.stdout
  answer = scipy.io.loadmat(out / "level_2" / "1.mat")["reconstruction"]
  assert answer.shape == (256, 256) and set(np.unique(answer)) <= {0, 1, 2}
  # a frame that lost electrode 5, which the model never saw removed
  challenge_folder(tmp_path / "other" / "level_3", layout, [5])
  for data, words in (
    (
      LEVELS / "level_1",
      r"data1.mat: the data are of ktc2023 .*\(32 electrodes, 76 patterns, 2356 values\), the "
      r"model was trained for device.mat .*\(16 electrodes, 16 patterns, .*256 values\)",
    ),
    # 60 = 16 patterns x the 2 pairs touching electrode 5 + the 2 patterns driving it x 16
    # values, less the 2 x 2 counted twice
    (tmp_path / "other", "frame 0 misses 60 values, which is none of the 2 electrode-removal"),
  ):
    bad_out = tmp_path / "refused"
    p = subprocess.run(
      [sys.executable, *common, f"--data_path={data}", f"--out={bad_out}"],
      capture_output=True,
      text=True,
      cwd=REPO,
    )
    assert p.returncode == 1 and p.stderr.count("error:") == 1, p.stderr[-3000:]
    assert re.search(words, p.stderr), p.stderr
    assert not bad_out.exists()


@pytest.mark.slow  # about 3 minutes on 2 cores
def test_a_model_for_a_skip_2_device_beats_tikhonov_on_its_held_out_simulations(tmp_path):
  """Trained a few minutes for the skip-2 device, CDEIT's RMSE on 32 held-out simulations is
  below the Tikhonov/NOSER image's of the same values, with and without electrode 3."""
  _, _, results, _ = _skip2_pipeline(
    tmp_path, 800, 600, dict(hidden_size=48, num_scales=1, cond_grid=32)
  )
  for removal in (0, 1):
    m = results[removal]
    print(
      f"removal {removal}:", {k: round(m[k]["rmse"], 4) for k in ("cdeit", "tikhonov", "empty")}
    )
    assert m["cdeit"]["rmse"] < m["tikhonov"]["rmse"], (removal, m["cdeit"], m["tikhonov"])


def test_a_model_keeps_its_device_when_the_file_moves_or_changes(device_run, tmp_path):
  """The checkpoint keeps the device's electrodes and patterns: with the device file gone, or
  replaced by another device's, the model loads as the system it was trained for; training
  refuses to resume under the other device (naming both); metadata without the record is one
  line."""
  from cdeit_jax.checkpoints import checkpoint, loading
  from cdeit_jax.infer.reconstructor import Reconstructor
  from cdeit_jax.train import resume

  d = device_run
  kept = tmp_path / "kept.mat"
  d.device.rename(kept)
  try:
    rec = Reconstructor.from_workdir(d.run, overrides={"sampling.num_samples": 1})
    assert rec.layout.signature == d.layout.signature and rec.guards.num_values == 256
    other = lay.from_rules(16, injection="skip-3", measure_injecting=True, clockwise=False)
    device_file(d.device, other)
    rec = Reconstructor.from_workdir(d.run, overrides={"sampling.num_samples": 1})
    assert rec.layout.signature == d.layout.signature
    meta = checkpoint.read_meta(d.run)
    with pytest.raises(checkpoint.CheckpointError, match="trained for device.mat .* now gives"):
      resume.check_device(meta, lay.resolve(str(d.device)), "RUN/0")
    d.device.unlink()
    old = {k: v for k, v in meta.items() if k != "device"}
    with pytest.raises(InputError, match="step 0: device: not a measuring system"):
      loading.resolve(loading.model_config(old), old)
  finally:
    d.device.unlink(missing_ok=True)
    kept.rename(d.device)


def test_removal_rules_without_the_full_set_and_rules_that_remove_everything(device_run):
  """A rule whose sets all remove something ('3;5') scales its channels on the device's whole
  training frames without each set in turn (finite scales, as training sees them); a set
  removing every electrode is one line naming it."""
  layout = lay.from_rules(16, **SKIP2)
  c = conditioning.LayoutConditioner(layout, (0.1,), removals="3;5", grid=16)
  scale = conditioning.calibrate(c, device_run.train)
  assert np.all(np.isfinite(scale)) and np.all(scale > 0)
  with pytest.raises(InputError, match=r"removing electrodes \[0, 1, .* 15\] leaves none"):
    conditioning.LayoutConditioner(layout, (0.1,), removals=",".join(map(str, range(16))), grid=16)


def test_symmetric_samples_of_a_model_that_reads_its_devices_values(device_run):
  """`sampling.symmetric` for a model that reads a device's values (`device_run`'s skip-2
  device, whose turns and mirror are symmetries): sample k of a frame is the plain sampler's
  sample k of the values turned for the k-th symmetry (`symmetry.turn_values`) with its image
  turned back; the Reconstructor refuses it in one line for this model, whose electrode-removal
  sets ('-;3') the turns would not keep."""
  import jax
  from flax import nnx

  from cdeit_jax.checkpoints import loading
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.eit import symmetry
  from cdeit_jax.infer import sampling
  from cdeit_jax.infer.reconstructor import Reconstructor
  from cdeit_jax.model.diffusion import Diffusion

  d = device_run
  rec = Reconstructor.from_workdir(d.run, overrides={"sampling.num_samples": 1})
  with pytest.raises(InputError, match="symmetric: the tank's turns and mirror .*removal sets"):
    Reconstructor.from_workdir(d.run, overrides={"sampling.symmetric": True})
  model, meta = loading.load(d.run)
  graphdef, weights = nnx.split(model)
  weights = jax.device_put(weights, shd.replicated(rec.mesh))
  parts = (graphdef, Diffusion(**loading.model_config(meta).diffusion), rec.steps, rec.eta)
  parts += (rec.shape, rec.mesh)
  plain = sampling.make_sampler(*parts)
  sym = sampling.make_sampler(*parts, None, (rec.mean, rec.std), rec.layout)
  cond = jnp.asarray(np.repeat(np.asarray(d.train[0]["cond"], np.float32)[None], 8, 0))
  index, sample = jnp.zeros(8, jnp.int32), jnp.arange(8, dtype=jnp.int32)
  key = jax.random.key(0)
  got = np.asarray(sym(weights, cond, index, sample, key))
  turned = symmetry.turn_values(cond, sample, rec.mean, rec.std, rec.layout)
  want = np.asarray(plain(weights, turned, index, sample, key))
  for k, g in enumerate(symmetry.GROUP):
    np.testing.assert_allclose(got[k], symmetry.image_back(want[k], *g), atol=2e-5, rtol=0)
    if k:  # a turned tank's sample is not the plain one
      assert np.abs(np.asarray(plain(weights, cond, index, sample, key))[k] - got[k]).max() > 1e-3
