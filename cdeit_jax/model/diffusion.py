"""Gaussian diffusion of CDEIT: linear schedule, x0-prediction L1 loss, and the DDIM-style sampler.

Schedule coefficients are computed in float64 on the host (as the reference does in numpy) and
applied in float32. The sampler is one jitted function: a `lax.scan` over the steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common.errors import InputError

Array = jax.Array
Denoiser = Callable[[Array, Array, Array], Array]  # (x_t, t, cond) -> x0


def linear_betas(num_steps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02):
  """DiT's linear schedule (scaled for 1000 steps), float64."""
  scale = 1000 / num_steps
  return np.linspace(beta_start * scale, beta_end * scale, num_steps, dtype=np.float64)


def sampling_pairs(num_steps: int, steps: int) -> list[tuple[int, int]]:
  """(t, t_next) pairs of the reference sampler: linspace(-1, T-1, steps+1) as int, reversed."""
  if not 1 <= steps <= num_steps:
    raise InputError(f"sampling steps must be in [1, {num_steps}], got {steps}")
  grid = np.linspace(-1, num_steps - 1, steps + 1).astype(np.int64)[::-1]
  return [(int(a), int(b)) for a, b in zip(grid[:-1], grid[1:])]


class Diffusion:
  """Linear-schedule diffusion with an x0-predicting network (CDEIT's `GaussianDiffusion`)."""

  def __init__(self, num_steps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02):
    self.num_steps, self.beta_start, self.beta_end = num_steps, beta_start, beta_end
    self.betas = linear_betas(num_steps, beta_start, beta_end)
    self.alphas_cumprod = np.cumprod(1.0 - self.betas)
    self._sqrt_ab = jnp.asarray(np.sqrt(self.alphas_cumprod), jnp.float32)
    self._sqrt_1mab = jnp.asarray(np.sqrt(1.0 - self.alphas_cumprod), jnp.float32)

  def _key(self):
    return (self.num_steps, self.beta_start, self.beta_end)

  def __hash__(self):  # hashable by value so that jit caches compiled samplers across instances
    return hash(self._key())

  def __eq__(self, other):
    return isinstance(other, Diffusion) and self._key() == other._key()

  # --------------------------------------------------------------------------- training

  def q_sample(self, x0: Array, t: Array, noise: Array) -> Array:
    """x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) noise, per example t."""
    expand = (slice(None),) + (None,) * (x0.ndim - 1)
    return self._sqrt_ab[t][expand] * x0 + self._sqrt_1mab[t][expand] * noise

  def loss(
    self, model: Denoiser, x0: Array, t: Array, cond: Array, noise: Array, mask: Array | None = None
  ) -> Array:
    """Mean absolute error between the model's x0 and x0, over pixels and the batch.

    `mask` (B,) weights examples (for padded batches); the mean is over the unmasked ones.
    """
    pred = model(self.q_sample(x0, t, noise), t, cond)
    err = jnp.abs(pred.astype(jnp.float32) - x0.astype(jnp.float32))
    if mask is None:
      return jnp.mean(err)
    per_example = jnp.mean(err.reshape(err.shape[0], -1), axis=1)
    return jnp.sum(per_example * mask) / jnp.maximum(jnp.sum(mask), 1)

  # --------------------------------------------------------------------------- sampling

  def sampler_coefficients(self, steps: int, eta: float) -> dict[str, np.ndarray]:
    """Per-step float64 coefficients of the reference sampler, as float32 arrays.

    The final step (t_next < 0) uses ab_next = 1, which makes sigma = c = 0 and returns x0
    exactly, so every step has the same form inside the scan.
    """
    ab = self.alphas_cumprod
    rows = []
    for t, t_next in sampling_pairs(self.num_steps, steps):
      ab_t = ab[t]
      ab_next = ab[t_next] if t_next >= 0 else 1.0
      sigma = eta * np.sqrt((1 - ab_t / ab_next) * (1 - ab_next) / (1 - ab_t))
      rows.append(
        (
          t,
          np.sqrt(1 / ab_t),
          np.sqrt(1 / ab_t - 1),
          np.sqrt(ab_next),
          np.sqrt(max(1 - ab_next - sigma**2, 0.0)),
          sigma,
        )
      )
    cols = list(zip(*rows))
    out = {
      k: np.asarray(v, np.float32)
      for k, v in zip(("recip_sqrt_ab", "sqrt_recipm1_ab", "sqrt_ab_next", "c", "sigma"), cols[1:])
    }
    out["t"] = np.asarray(cols[0], np.int32)
    return out

  def sample_fn(
    self,
    apply: Denoiser,
    cond: Array,
    *,
    steps: int = 5,
    eta: float = 1.0,
    key: Array | None = None,
    noises: Array | None = None,
    shape: tuple[int, ...] = (128, 128, 1),
    correct: Callable[[Array, Array], Array] | None = None,
  ) -> Array:
    """Traceable sampler: `apply(x, t, cond)` returns x0. Use inside jit (see `sample`).

    `correct(x0, cond)`, when given, replaces each step's x0 estimate before the update (data
    consistency, `cdeit_jax.eit.conditioning.DataConsistency`); the last step returns it.

    `noises` (steps, B, H, W, C): the start noise, then one per non-final step (the last entry
    is unused). Without `noises`, draws from `key` (start: fold_in(key, 0); step i: i + 1). A
    key per example (`key` of shape (B,)) makes each example's draws independent of the batch
    it is in (evaluation is then the same on any number of devices or batch size).
    """
    coef = {k: jnp.asarray(v) for k, v in self.sampler_coefficients(steps, eta).items()}
    b = cond.shape[0]
    if noises is None:
      if key is None:
        raise InputError("sample needs `key` or explicit `noises`")
      if key.shape == (b,):
        one = lambda k, i: jax.random.normal(jax.random.fold_in(k, i), shape, jnp.float32)
        draw = lambda i: jax.vmap(one, in_axes=(0, None))(key, i)
      else:
        draw = lambda i: jax.random.normal(jax.random.fold_in(key, i), (b, *shape), jnp.float32)
      x = draw(0)
      step_noise = jnp.arange(1, steps + 1)
    else:
      x = noises[0].astype(jnp.float32)
      step_noise = jnp.concatenate([noises[1:], jnp.zeros_like(noises[:1])]).astype(jnp.float32)

    def step(x, inputs):
      c, z = inputs
      t = jnp.full((b,), c["t"], jnp.int32)
      x0 = apply(x, t, cond).astype(jnp.float32)
      if correct is not None:
        x0 = correct(x0, cond).astype(jnp.float32)
      eps = (x * c["recip_sqrt_ab"] - x0) / c["sqrt_recipm1_ab"]
      if noises is None:
        z = draw(z)
      return x0 * c["sqrt_ab_next"] + c["c"] * eps + c["sigma"] * z, None

    x, _ = jax.lax.scan(step, x, (coef, step_noise))
    return x

  def sample(
    self,
    model: nnx.Module,
    cond: Array,
    *,
    key: Array | None = None,
    steps: int = 5,
    eta: float = 1.0,
    noises: Array | None = None,
  ) -> Array:
    """Reconstruct images (B, H, W, C) for conditions `cond` (B, 16, 16, 1), one jitted call."""
    graphdef, state = nnx.split(model)
    shape = (model.image_size, model.image_size, model.in_channels)
    return _jitted_sample(self, graphdef, shape, steps, float(eta), state, cond, key, noises)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _jitted_sample(diffusion, graphdef, shape, steps, eta, state, cond, key, noises):
  model = nnx.merge(graphdef, state)
  return diffusion.sample_fn(model, cond, steps=steps, eta=eta, key=key, noises=noises, shape=shape)
