"""Diffusion schedule, loss and sampler against the reference code (tests/fixtures)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, nhwc
from flax import nnx

from cdeit_jax.model.diffusion import Diffusion, sampling_pairs


@pytest.fixture(scope="module")
def fx():
  with np.load(FIXTURES / "diffusion.npz") as z:
    return {k: z[k] for k in z.files}


def test_schedule_matches_reference(fx):
  d = Diffusion()
  np.testing.assert_allclose(d.betas, fx["betas"], rtol=1e-12, atol=0)
  np.testing.assert_allclose(d.alphas_cumprod, fx["alphas_cumprod"], rtol=1e-12, atol=0)


def test_sampling_pairs_as_published():
  assert sampling_pairs(1000, 5) == [(999, 799), (799, 599), (599, 399), (399, 199), (199, -1)]
  with pytest.raises(ValueError, match="sampling steps"):
    sampling_pairs(1000, 0)


def test_q_sample_hand_computed():
  d = Diffusion()
  x0, noise = jnp.full((2, 4, 4, 1), 0.5), jnp.full((2, 4, 4, 1), -1.0)
  t = jnp.array([0, 999])
  ab = np.cumprod(1 - np.linspace(1e-4, 0.02, 1000))[[0, 999]]
  want = np.sqrt(ab) * 0.5 - np.sqrt(1 - ab)
  np.testing.assert_allclose(np.asarray(d.q_sample(x0, t, noise))[:, 0, 0, 0], want, rtol=1e-6)


def test_loss_matches_reference(small_model, fx):
  d = Diffusion()
  loss = nnx.jit(lambda m, *a: d.loss(m, *a))(
    small_model,
    jnp.asarray(nhwc(fx["x0"])),
    jnp.asarray(fx["t"]),
    jnp.asarray(nhwc(fx["y"])),
    jnp.asarray(nhwc(fx["noise"])),
  )
  assert abs(float(loss) - float(fx["l1_loss"])) < 1e-5


def test_masked_loss_ignores_padding(tiny_model):
  d, k = Diffusion(), jax.random.split(jax.random.key(0), 3)
  x0, noise = jax.random.normal(k[0], (2, 32, 32, 1)), jax.random.normal(k[1], (2, 32, 32, 1))
  cond, t = jax.random.normal(k[2], (2, 16, 16, 1)), jnp.array([5, 600])
  loss = nnx.jit(lambda m, *a, mask: d.loss(m, *a, mask=mask))
  x_t = np.sqrt(d.alphas_cumprod[[5, 600]])[:, None, None, None] * np.asarray(x0) + np.sqrt(
    1 - d.alphas_cumprod[[5, 600]]
  )[:, None, None, None] * np.asarray(noise)
  pred = nnx.jit(lambda m, *a: m(*a))(tiny_model, jnp.asarray(x_t, jnp.float32), t, cond)
  per_example = np.abs(np.asarray(pred) - np.asarray(x0)).reshape(2, -1).mean(1)
  for mask, want in (
    ([1.0, 1.0], per_example.mean()),
    ([1.0, 0.0], per_example[0]),
    ([0.0, 1.0], per_example[1]),
  ):
    got = float(loss(tiny_model, x0, t, cond, noise, mask=jnp.array(mask)))
    assert abs(got - want) < 1e-6, (mask, got, want)


def test_sample_matches_reference(small_model, fx):
  d = Diffusion()
  assert int(fx["sampler_steps"]) == 5 and float(fx["sampler_eta"]) == 1.0
  out = d.sample(
    small_model,
    jnp.asarray(nhwc(fx["y"])),
    steps=5,
    eta=1.0,
    noises=jnp.asarray(nhwc(fx["sampler_noises"])),
  )
  assert np.abs(np.asarray(out) - nhwc(fx["sample"])).max() < 1e-4


def _python_loop_sampler(model, cond, noises, steps, eta):
  """A second implementation: the reference algorithm as a plain float64 host loop."""
  ab = Diffusion().alphas_cumprod
  x = np.asarray(noises[0], np.float64)
  apply = nnx.jit(lambda m, *a: m(*a))
  for i, (t, t_next) in enumerate(sampling_pairs(1000, steps)):
    x0 = np.asarray(
      apply(model, jnp.asarray(x, jnp.float32), jnp.full((x.shape[0],), t), cond), np.float64
    )
    eps = (x / np.sqrt(ab[t]) - x0) / np.sqrt(1 / ab[t] - 1)
    if t_next < 0:
      return x0
    sigma = eta * np.sqrt((1 - ab[t] / ab[t_next]) * (1 - ab[t_next]) / (1 - ab[t]))
    c = np.sqrt(1 - ab[t_next] - sigma**2)
    x = x0 * np.sqrt(ab[t_next]) + c * eps + sigma * np.asarray(noises[i + 1], np.float64)


@pytest.mark.parametrize("steps, eta", [(5, 1.0), (3, 0.5), (2, 0.0), (1, 1.0)])
def test_sampler_matches_python_loop(tiny_model, steps, eta):
  cond = jax.random.normal(jax.random.key(2), (2, 16, 16, 1))
  noises = jax.random.normal(jax.random.key(3), (steps, 2, 32, 32, 1))
  out = Diffusion().sample(tiny_model, cond, steps=steps, eta=eta, noises=noises)
  want = _python_loop_sampler(tiny_model, cond, np.asarray(noises), steps, eta)
  assert np.abs(np.asarray(out) - want).max() < 1e-4


def test_sample_from_key_uses_documented_draws(tiny_model):
  """With a key, draw i is normal(fold_in(key, i)): equal to passing those noises explicitly."""
  cond = jax.random.normal(jax.random.key(2), (2, 16, 16, 1))
  key, d = jax.random.key(7), Diffusion()
  noises = jnp.stack(
    [jax.random.normal(jax.random.fold_in(key, i), (2, 32, 32, 1)) for i in range(5)]
  )
  a = d.sample(tiny_model, cond, key=key)
  b = d.sample(tiny_model, cond, noises=noises)
  c = d.sample(tiny_model, cond, key=jax.random.key(8))
  assert a.shape == (2, 32, 32, 1)
  assert np.abs(np.asarray(a) - np.asarray(b)).max() < 1e-5
  assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-2


def test_sample_needs_key_or_noises(tiny_model):
  with pytest.raises(ValueError, match="key"):
    Diffusion().sample(tiny_model, jnp.zeros((1, 16, 16, 1)))
