"""The bfloat16 audit: each trap of 16-bit diffusion training that the field has met, with a CPU
test (bfloat16 runs on CPU) against float32, the second implementation, or a hand computation.

- The loss's gradient of the output projection's bias is a sum over every pixel of residuals
  that nearly cancel: a 16-bit output rounds it away (the published size: cosine 0.52 against
  float32 before the projection was kept in float32). Test: every gradient, and that bias's.
- Timesteps rounded in bfloat16 (999.39 becomes 1000): the embedding takes integer steps in
  float32. Test: the embedding of 999 and 1000 against numpy in float64.
- Scheduler constants cast to bfloat16 (NaN at a sampler's last step, diffusers #4254): the
  diffusion's constants stay float32 and the sampler's images stay finite and close to float32's.
- Parameters and normalisation in float32: tests/test_model.py
  (test_bfloat16_keeps_params_float32).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from conftest import REPO
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import sharding as shd
from cdeit_jax.data import sources
from cdeit_jax.model import layers, network
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.train import training


def _grads(cfg, dtype, params, batch, t, noise):
  c = cfg.copy_and_resolve_references()
  c.model.dtype, c.batch_size = dtype, len(t)
  ts = training.setup(c, loading.resolve(c), shd.make_mesh(jax.devices()[:1]))
  if params is None:  # made non-zero: a fresh model's last layer is zero (output 0)
    rng = np.random.default_rng(3)
    params = jax.tree.map(
      lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(a.dtype), ts.state.params
    )

  def loss(p):
    model = nnx.merge(ts.graphdef, p, ts.constants)
    return ts.diffusion.loss(model, batch["target"], t, batch["cond"], noise)

  return params, jax.jit(jax.value_and_grad(loss))(params)


def _cos(a, b) -> float:
  a, b = (
    np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]).astype(np.float64) for g in (a, b)
  )
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_bfloat16_gradients_point_where_float32_ones_do():
  """One batch of 8 real UEF2017 cases, the same weights, noise and timesteps: the bfloat16 loss
  within 0.1 % of float32's, every gradient's cosine >= 0.999, the output bias's >= 0.99."""
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  src = sources.NpzSource(str(REPO / "data" / "uef2017"), "uef2017", "authors")
  batch = {k: np.stack([src[i][k] for i in range(8)]) for k in ("cond", "target")}
  key_t, key_n = jax.random.split(jax.random.key(0))
  t = jax.random.randint(key_t, (8,), 0, 1000)
  noise = jax.random.normal(key_n, batch["target"].shape, jnp.float32)
  params, (l32, g32) = _grads(cfg, "float32", None, batch, t, noise)
  _, (l16, g16) = _grads(cfg, "bfloat16", params, batch, t, noise)
  assert float(l32) > 0.01 and abs(float(l16) - float(l32)) <= 1e-3 * float(l32)
  assert _cos(g32, g16) >= 0.999
  bias = lambda g: g["final_layer"]["linear"]["bias"]
  assert _cos(bias(g32), bias(g16)) >= 0.99


def test_timesteps_are_embedded_exactly():
  """The embedding of steps 999 and 1000 against numpy's float64 sin and cos: distinct and
  within float32's rounding (a step rounded in bfloat16 would give 1000 for both)."""
  t = np.array([999, 1000])
  freqs = np.exp(-math.log(10000.0) * np.arange(128) / 128)
  args = t[:, None] * freqs[None]
  want = np.concatenate([np.cos(args), np.sin(args)], axis=-1)
  got = np.asarray(layers.timestep_embedding(jnp.asarray(t)))
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=2e-4)
  assert np.abs(got[0] - got[1]).max() > 0.5


def test_the_bfloat16_sampler_keeps_float32_constants_and_finite_images(tiny_run):
  """The diffusion's constants are float32 whatever the model's dtype; the test model sampling
  in bfloat16 (10 steps, down to the last) gives finite images within 0.05 of float32's
  sampling of the same voltages, noise and seed."""
  from cdeit_jax.infer.reconstructor import Reconstructor

  d = Diffusion()
  assert d._sqrt_ab.dtype == jnp.float32 and d._sqrt_1mab.dtype == jnp.float32
  ys = np.stack(
    [np.load(f)["ys"].ravel() for f in sorted((REPO / "data" / "uef2017").glob("*.npz"))[:4]]
  )
  over = {"sampling.steps": 10, "sampling.num_samples": 2, "sampling.seed": 1}
  images = {}
  for dtype in ("float32", "bfloat16"):
    rec = Reconstructor.from_workdir(
      tiny_run, units="uef2017", overrides={**over, "model.dtype": dtype}
    )
    images[dtype] = rec.reconstruct(ys).images
  assert np.isfinite(images["bfloat16"]).all()
  assert np.abs(images["float32"]).max() > 0.05  # not a trivial pair of zeros
  np.testing.assert_allclose(images["bfloat16"], images["float32"], atol=0.05)


def test_bfloat16_params_and_the_output_projection_stay_float32():
  """In a bfloat16 model every parameter is float32 and the output projection computes in
  float32."""
  cfg = config_lib.load(str(REPO / "configs" / "test.py"))
  cfg.model.dtype = "bfloat16"
  model = network.CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  assert model.final_layer.linear.dtype == jnp.float32
