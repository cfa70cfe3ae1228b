"""Physics-informed conditioning and data-consistent sampling, against independent implementations:
the 208 x 208-form Tikhonov matrix of `eit.tikhonov`, the autodiff Jacobian, numpy."""

import json
import logging
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cdeit_jax import config_lib, convert, eit
from cdeit_jax.checkpoints import checkpoint, loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.data import sources
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.eit import conditioning, layout, measurement
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.layout import preset
from cdeit_jax.infer import data_kinds
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.model.network import CDEIT
from cdeit_jax.train import training

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

REPO = pathlib.Path(__file__).parent.parent
UEF = str(REPO / "data" / "uef2017")
DISK = ph.disk_mask(128)
ALPHAS = (0.03, 0.3)


@pytest.fixture(scope="module")
def uef():
  """The 22 tank cases standardised with the authors' statistics (as a real evaluation)."""
  return sources.NpzSource(UEF, "uef2017", "authors")


@pytest.fixture(scope="module")
def cond_and_ys(uef):
  exs = [uef[i] for i in range(6)]
  raw = np.stack([np.load(f"{UEF}/{uef.files[i]}")["ys"].reshape(208) for i in range(6)])
  return jnp.asarray(np.stack([e["cond"] for e in exs])), raw / uef.voltage_ratio


@pytest.fixture(scope="module")
def conditioner(uef):
  c = conditioning.LinearConditioner(ALPHAS, layout=CDEIT16)
  c.voltage_mean[...] = jnp.asarray(uef.mean.ravel())
  c.voltage_std[...] = jnp.asarray(uef.std.ravel())
  return c


def test_voltages_read_back_from_the_eim(conditioner, cond_and_ys):
  cond, ys = cond_and_ys
  np.testing.assert_allclose(conditioner.voltages(cond), ys, rtol=1e-5, atol=1e-12)


def test_channels_equal_the_tikhonov_matrix(conditioner, cond_and_ys):
  """One shared eigen-factorisation gives every level's M_alpha y (the 208 x 208 form directly)."""
  cond, ys = cond_and_ys
  got = np.asarray(conditioner.channels(cond, scaled=False))
  assert got.shape == (6, 128, 128, len(ALPHAS))
  for k, alpha in enumerate(ALPHAS):
    want = eit.Tikhonov(eit.tikhonov.layout_jacobian(CDEIT16), alpha=alpha)(ys)
    assert np.abs(got[..., k] - want).max() <= 1e-5 * np.abs(want).max()
    assert np.all(got[:, ~DISK, k] == 0)


def test_conditioner_follows_the_simulators_contact_impedance(conditioner, cond_and_ys, uef):
  """The model built from a config computes its channels with the Jacobian of
  config.simulator's system: at contact impedance 0.05 they are the Tikhonov images of that
  system's Jacobian (a second implementation), and differ from those at the default 0.01."""
  from cdeit_jax.eit import tikhonov

  cond, ys = cond_and_ys
  cfg = _pi_config()
  cfg.simulator.contact_impedance = 0.05
  model = loading.build(cfg, loading.resolve(cfg))
  model.conditioner.voltage_mean[...] = jnp.asarray(uef.mean.ravel())
  model.conditioner.voltage_std[...] = jnp.asarray(uef.std.ravel())
  got = np.asarray(model.conditioner.channels(cond, scaled=False))
  default = np.asarray(conditioner.channels(cond, scaled=False))
  jac = tikhonov.layout_jacobian(layout.preset("cdeit16").with_contact_impedance(0.05))
  for k, alpha in enumerate(ALPHAS):
    want = eit.Tikhonov(jac, alpha=alpha)(ys)
    assert np.abs(got[..., k] - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got[..., k] - default[..., k]).max() > 1e-2 * np.abs(want).max()


def test_forward_is_the_jacobian_inside_the_disk(conditioner):
  j = eit.jacobian(eit.default_simulator(CDEIT16)).reshape(208, -1).astype(np.float64)
  x = np.random.default_rng(0).normal(size=(3, 128, 128)).astype(np.float32)
  want = x.reshape(3, -1) @ (j * DISK.reshape(-1)).T
  got = np.asarray(conditioner.forward(jnp.asarray(x)))
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_calibrate_scales_each_channel_to_unit_std(uef):
  c = conditioning.LinearConditioner(ALPHAS, layout=CDEIT16)
  scale = conditioning.calibrate(c, uef, limit=10, batch=4)
  raw = np.stack([uef[i]["voltages"] for i in range(10)]).reshape(10, 208) * uef.std.reshape(
    208
  ) + uef.mean.reshape(208)
  for k, alpha in enumerate(ALPHAS):
    std = (
      eit.Tikhonov(eit.tikhonov.layout_jacobian(CDEIT16), alpha=alpha)(raw)[:, DISK]
      .astype(np.float64)
      .std()
    )
    assert scale[k] == pytest.approx(1 / std, rel=1e-4)
  np.testing.assert_array_equal(c.voltage_std[...], uef.std.ravel())


def test_data_consistency_step(uef, cond_and_ys):
  cond, ys = cond_and_ys
  dc = conditioning.DataConsistency(uef.mean, uef.std, layout=CDEIT16, strength=1.0, alpha=0.1)
  # from the empty image, one full step is the one-step Tikhonov image (inside the disk)
  got = np.asarray(dc(jnp.zeros((6, 128, 128, 1)), cond))[..., 0]
  want = eit.Tikhonov(eit.tikhonov.layout_jacobian(CDEIT16), alpha=0.1)(ys)
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
  # an image whose linearised voltages are the measurements is a fixed point
  x = jnp.asarray(
    np.random.default_rng(1).normal(size=(6, 128, 128, 1)) * DISK[..., None], jnp.float32
  )
  y = np.asarray(dc.op.forward(x))
  eim = measurement.eim(
    ((y / 1.0 - uef.mean.reshape(208)) / uef.std.reshape(208)).reshape(6, 16, 13), CDEIT16
  )
  fixed = np.asarray(dc(x, jnp.asarray(eim[..., None], jnp.float32)))
  assert np.abs(fixed - np.asarray(x)).max() <= 1e-3 * np.abs(np.asarray(x)).max()
  # half strength moves half way; each step shrinks the data misfit
  half = conditioning.DataConsistency(uef.mean, uef.std, layout=CDEIT16, strength=0.5, alpha=0.1)
  np.testing.assert_allclose(
    np.asarray(half(jnp.zeros((6, 128, 128, 1)), cond))[..., 0], got / 2, rtol=1e-5, atol=1e-7
  )
  misfit = lambda z: np.linalg.norm(np.asarray(dc.op.forward(z)) - ys)
  z = jnp.zeros((6, 128, 128, 1))
  last = misfit(z)
  for _ in range(3):
    z = dc(z, cond)
    assert misfit(z) < last
    last = misfit(z)


def test_sampler_applies_the_correction_every_step():
  """A model f with the correction x0 + d samples exactly as the model f + d without one: the
  correction acts on every step's x0 (the trajectory depends on each step, since f reads its
  input), and the last step returns the corrected x0."""
  d = jnp.full((2, 128, 128, 1), 0.25)
  apply = lambda x, t, cond: 0.5 * x
  sample = lambda f, correct: Diffusion().sample_fn(
    f, jnp.zeros((2, 16, 16, 1)), steps=3, key=jax.random.key(0), correct=correct
  )
  corrected = sample(apply, lambda x0, c: x0 + d)
  np.testing.assert_allclose(
    corrected, sample(lambda x, t, c: apply(x, t, c) + d, None), rtol=0, atol=1e-6
  )
  # correcting only the last step is another trajectory
  last_only = sample(apply, None) + d
  assert np.abs(np.asarray(corrected - last_only)).max() > 1e-3


def _pi_config():
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  cfg.model.update(cond="eim+linear", cond_alphas=ALPHAS)
  return cfg


# make test-all: 34 s; a model reading values trains in test_any_system.py, models/cdeit16
#  evaluates in test_shipped.py
@pytest.mark.slow
def test_physics_informed_model_trains_saves_and_evaluates(uef, tmp_path, caplog):
  """setup() calibrates on the training source; the checkpoint carries operator and calibration,
  so the restored model computes the same outputs; eval.py follows the checkpoint's condition,
  reports the empty-image floor and applies data consistency."""
  cfg = _pi_config()
  mesh = shd.make_mesh()
  ts = training.setup(cfg, loading.resolve(cfg), mesh, calibration_source=uef)
  model = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
  assert model.x_embedder.kernel.shape[2] == 2 + len(ALPHAS)
  np.testing.assert_array_equal(model.conditioner.voltage_mean[...], uef.mean.ravel())
  assert np.all(np.asarray(model.conditioner.scale[...]) > 1)  # recon std << 1 on UEF2017
  # non-zero weights so that the output depends on every input channel
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  params = nnx.state(model, nnx.Param)
  noisy = jax.tree.map(lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), params)
  nnx.update(model, noisy)
  checkpoint.save_inference(str(tmp_path / "run"), model, cfg, mean=uef.mean, std=uef.std)
  loaded, meta = loading.load(str(tmp_path / "run"))
  assert meta["model"]["cond"] == "eim+linear" and meta["model"]["cond_alphas"] == list(ALPHAS)
  x = jnp.asarray(rng.normal(size=(2, 128, 128, 1)), jnp.float32)
  cond = jnp.asarray(np.stack([uef[i]["cond"] for i in range(2)]))
  t = jnp.array([10, 500])
  np.testing.assert_array_equal(loaded(x, t, cond), model(x, t, cond))
  for name in ("scale", "voltage_std", "basis_t"):
    np.testing.assert_array_equal(
      getattr(loaded.conditioner, name)[...], getattr(model.conditioner, name)[...]
    )
  # the linear channels matter: zeroing them changes the output
  loaded.conditioner.scale[...] = jnp.zeros(len(ALPHAS))
  assert np.abs(np.asarray(loaded(x, t, cond)) - np.asarray(model(x, t, cond))).max() > 1e-3

  out = tmp_path / "eval"
  r = data_kinds.evaluate(
    str(tmp_path / "run"),
    "uef2017",
    UEF,
    str(out),
    {
      "sampling.steps": 2,
      "sampling.batch_size": 8,
      "eval.max_examples": 8,
      "eval.figure": False,
      "sampling.data_consistency": 0.5,
    },
  )
  m = json.loads((out / "metrics.json").read_text())
  assert m["settings"]["data_consistency"] == 0.5
  target = np.stack([uef[i]["target"][..., 0] for i in range(8)])
  assert m["metrics"]["empty"]["rmse"] == pytest.approx(np.sqrt((target**2).mean()), rel=1e-9)
  assert "cc" not in m["metrics"]["empty"]
  assert 0 < r["metrics"]["cdeit"]["ssim_disk"] < 1
  # other statistics than the model's: a warning, since its channels would be wrong
  other = tmp_path / "other_stats"
  stats_lib.write_stats(str(other), uef.mean * 1.1, uef.std)
  with caplog.at_level(logging.WARNING, logger="cdeit_jax"):
    data_kinds.evaluate(
      str(tmp_path / "run"),
      "uef2017",
      UEF,
      str(tmp_path / "e2"),
      {
        "sampling.steps": 1,
        "sampling.batch_size": 8,
        "eval.max_examples": 1,
        "eval.figure": False,
        "eval.stats": str(other),
      },
    )
  assert "other statistics than this physics-informed model" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="cdeit_jax"):
    data_kinds.evaluate(
      str(tmp_path / "run"),
      "uef2017",
      UEF,
      str(tmp_path / "e3"),
      {"sampling.steps": 1, "sampling.batch_size": 8, "eval.max_examples": 1, "eval.figure": False},
    )
  assert "other statistics" not in caplog.text
  # the README's figure from the same outputs
  from cdeit_jax.infer import evaluation_table

  evaluation_table.figure(str(out), str(tmp_path / "fig.png"), rows=2)
  assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_converting_a_physics_informed_model_is_refused():
  model = CDEIT(
    **config_lib.model_kwargs(_pi_config(), loading.resolve(_pi_config())), rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match="cond='eim'"):
    convert.export_torch_state_dict(model)


@pytest.mark.parametrize(
  "over, match",
  [
    (dict(cond="tikhonov"), "config.model.cond"),
    (dict(cond_alphas=(0.1, -1.0)), "config.model.cond_alphas"),
    (dict(cond_alphas=()), "config.model.cond_alphas"),
  ],
)
def test_bad_condition_settings_are_named(over, match):
  cfg = _pi_config()
  cfg.model.update(over)
  with pytest.raises(ValueError, match=match):
    config_lib.model_kwargs(cfg, loading.resolve(cfg))
