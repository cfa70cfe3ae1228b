"""The segmenter (`CDEIT(output="classes")`, `model.classes`): class maps, its cross-entropy
against a hand computation, and its training through the sharded train step."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.eit import phantom as ph
from cdeit_jax.infer import reconstructor
from cdeit_jax.model import classes, output_kinds
from cdeit_jax.train import training

REPO = pathlib.Path(__file__).parent.parent


def _config(**model):
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  cfg.model.update({"cond": "eim+linear", "cond_alphas": (0.03, 0.3), "output": "classes", **model})
  return cfg


@pytest.fixture(scope="module")
def uef():
  return sources.NpzSource(str(REPO / "data" / "uef2017"), "uef2017", "authors")


@pytest.fixture(scope="module")
def batch(uef):
  exs = [uef[i] for i in range(8)]
  return {k: np.stack([e[k] for e in exs]) for k in ("cond", "target")}


def test_class_map_thresholds_at_a_quarter_inclusive_for_numpy_and_jax():
  label = np.array([[-1.0, -0.25, -0.2499], [0.0, 0.2499, 0.25]], np.float32)
  want = np.array([[1, 1, 0], [0, 0, 2]])
  np.testing.assert_array_equal(ph.class_map(label), want)
  assert ph.class_map(label).dtype == np.uint8
  np.testing.assert_array_equal(np.asarray(ph.class_map(jnp.asarray(label))), want)


def test_segmenter_loss_is_the_hand_computed_cross_entropy(uef, batch):
  mesh = shd.make_mesh(jax.devices()[:1])
  ts = training.setup(_config(), loading.resolve(_config()), mesh, calibration_source=uef)
  model = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
  # the image input is gone: the patch embedding reads the EIM and the 2 linear channels
  assert model.x_embedder.kernel.shape[2] == 1 + 2
  cond, target = jnp.asarray(batch["cond"]), jnp.asarray(batch["target"])
  # adaLN-zero: a fresh segmenter's logits are 0, so its loss is log 3 on every pixel
  np.testing.assert_allclose(float(classes.loss(model, target, cond)), np.log(3), rtol=1e-6)
  # non-zero weights: the loss against numpy's log-softmax of the same logits
  rng = np.random.default_rng(0)
  params = nnx.state(model, nnx.Param)
  nnx.update(
    model,
    jax.tree.map(lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), params),
  )
  logits = np.asarray(model.segment(cond), np.float64)
  assert logits.shape == (8, 128, 128, 3) and np.abs(logits).max() > 1e-3
  labels = target[..., 0]
  truth = np.where(labels >= 0.25, 2, np.where(labels <= -0.25, 1, 0))
  assert set(np.unique(truth)) == {0, 1, 2}  # UEF2017's targets hold both classes
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  hand = -np.take_along_axis(log_p, truth[..., None], -1)[..., 0].mean((1, 2))
  np.testing.assert_allclose(classes.per_example_loss(model, target, cond), hand, rtol=2e-5)
  mask = jnp.array([1, 0, 1, 1, 0, 0, 0, 1], jnp.float32)
  np.testing.assert_allclose(
    float(classes.loss(model, target, cond, mask)), hand[[0, 2, 3, 7]].mean(), rtol=2e-5
  )
  p = np.asarray(classes.probabilities(model, cond))
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.log(p), log_p, atol=2e-5)


def test_a_segmenter_and_a_denoiser_refuse_each_others_calls(uef, batch):
  mesh = shd.make_mesh(jax.devices()[:1])
  ts = training.setup(_config(), loading.resolve(_config()), mesh, calibration_source=uef)
  seg = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
  x, t = jnp.zeros((1, 128, 128, 1)), jnp.zeros((1,), jnp.int32)
  cond = jnp.asarray(batch["cond"][:1])
  with pytest.raises(InputError, match="outputs 'classes', not images: call segment"):
    seg(x, t, cond)
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  ts = training.setup(cfg, loading.resolve(cfg), mesh)
  den = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
  with pytest.raises(InputError, match="outputs 'image', not classes"):
    den.segment(cond)
  with pytest.raises(InputError, match=r"output 'mask' must be one of .*config.model.output"):
    training.setup(_config(output="mask"), loading.resolve(_config(output="mask")), mesh)
  eim = _config()
  eim.model.cond = "eim"
  with pytest.raises(InputError, match='output "classes" reads the condition alone'):
    training.setup(eim, loading.resolve(eim), mesh)


@pytest.mark.slow  # 50 s; the cross-entropy against a hand computation and an image model
# learning a fixed batch on 8 devices (test_training.py) run by default
def test_a_segmenter_learns_a_fixed_batch_on_8_devices(uef, batch):
  """The sharded train step with the cross-entropy: from log 3 (a fresh segmenter) to well below
  the classes' entropy on 8 examples, and the eval step's losses are the model's."""
  mesh = shd.make_mesh(jax.devices())
  ts = training.setup(_config(), loading.resolve(_config()), mesh, calibration_source=uef)
  c = training.compile_train_step(ts, 8, mesh, False)
  constants = jax.device_put(ts.constants, c.constants_shardings)
  state = jax.device_put(jax.device_get(ts.state), c.state_shardings)
  data = {k: jax.device_put(v, shd.batch_sharded(mesh)) for k, v in batch.items()}
  rng, losses = jax.random.key(0), []
  for _ in range(60):
    state, m = c.fn(state, data, rng, constants)
    losses.append(m["loss"])
  losses = np.asarray(jax.device_get(losses))
  np.testing.assert_allclose(losses[0], np.log(3), rtol=1e-5)
  # below what no segmenter blind to the condition can reach: the classes' entropy in the batch
  labels = batch["target"][..., 0]
  prior = np.bincount(ph.class_map(labels).ravel(), minlength=3) / labels.size
  assert losses[-5:].mean() < 0.6 * -(prior * np.log(prior)).sum(), losses
  eval_step = jax.jit(training.make_eval_step(ts.graphdef, ts.diffusion))
  mask = np.ones(8, np.float32)
  total, n = eval_step(state.params, constants, {**batch, "mask": mask}, rng)
  model = nnx.merge(ts.graphdef, jax.device_get(state.params), jax.device_get(constants))
  want = classes.per_example_loss(model, jnp.asarray(batch["target"]), jnp.asarray(batch["cond"]))
  np.testing.assert_allclose(float(total), float(np.sum(want)), rtol=1e-4)
  assert float(n) == 8


def test_the_reconstructor_gives_a_segmenters_probabilities_and_their_class_contrast(uef, batch):
  """Through the sharded, bucketed sampler on 8 devices: the model's own probabilities (one
  deterministic pass, however many samples are asked for), the image and std of the class
  contrast (-1, 0, +1) they imply; and that contrast by hand for one pixel."""
  ts = training.setup(
    _config(), loading.resolve(_config()), shd.make_mesh(jax.devices()[:1]), calibration_source=uef
  )
  model = nnx.merge(ts.graphdef, ts.state.params, ts.constants)
  rng = np.random.default_rng(1)
  params = nnx.state(model, nnx.Param)
  nnx.update(
    model, jax.tree.map(lambda a: a + 0.1 * rng.standard_normal(a.shape).astype(np.float32), params)
  )
  want = np.asarray(classes.probabilities(model, jnp.asarray(batch["cond"][:5])))
  rec = reconstructor.Reconstructor(model, _config(), uef.mean, uef.std)
  assert rec.output is output_kinds.of("classes") and rec.num_samples == 1 and rec.steps == 0
  for k in (None, 8):
    r = rec._sample(batch["cond"][:5], k, 0, True, None)
    np.testing.assert_allclose(r.probabilities, want, atol=2e-6)
  assert r.samples is None and r.probabilities.shape == (5, 128, 128, 3)
  np.testing.assert_allclose(r.images, want[..., 2] - want[..., 1], atol=2e-6)
  var = want[..., 2] + want[..., 1] - (want[..., 2] - want[..., 1]) ** 2
  np.testing.assert_allclose(r.std, np.sqrt(var), atol=1e-5)
  # water 0.2, resistive 0.3, conductive 0.5: mean 0.2, E[c^2] 0.8, std sqrt(0.76)
  one = rec.output.reconstruction(np.array([[[[0.2, 0.3, 0.5]]]]), 1, 2.0, False)
  assert one["images"][0, 0, 0] == pytest.approx(0.2, abs=1e-7)
  assert one["std"][0, 0, 0] == pytest.approx(2 * np.sqrt(0.76), abs=1e-6)
