"""Physics-informed conditioning: one-step linear reconstructions of the measured voltages as extra
input channels of the network, and the data-consistency step of the sampler.

With `config.model.cond = "eim+linear"` the network sees, beside the noisy image and the upsampled
EIM (the published condition, `"eim"`), one NOSER-weighted Tikhonov reconstruction of the same
voltages per level in `config.model.cond_alphas`. All levels share one factorisation of the
linearised forward model at the homogeneous background (J, 208 x pixels; W = diag(J^T J)^p):

    G = J W^-1 J^T = U diag(s) U^T,    B = W^-1 J^T U            (pixels x 208)
    M_alpha = W^-1 J^T (G + lambda I)^-1 = B diag(1 / (s + lambda)) U^T
    J = U B^T W                                                   (used by data consistency)

so every level costs one (208 x pixels) matrix product per example on the device, and the same
factors give J for data-consistent sampling. lambda = alpha * trace(G) / 208 as in
`eit.tikhonov.Tikhonov`. The factors are fixed variables recomputed from the config (M_alpha
and J do not depend on the eigenvectors' signs or on the basis of a repeated eigenvalue); the
training set's voltage statistics and the channels' scales (`Calibration`) are recorded in the
checkpoint's metadata, so a checkpoint reproduces its conditioning for simulated and real
presets.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common.errors import InputError
from cdeit_jax.common.variables import Calibration, Fixed
from cdeit_jax.eit import measurement, tikhonov
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.measurement import NUM_MEASUREMENTS

CALIBRATION_EXAMPLES = 1024  # training examples whose channel std sets the channel scale


@functools.lru_cache(maxsize=4)
def linear_factors(
  noser_exponent: float = tikhonov.NOSER_EXPONENT,
  system: measurement.System = measurement.NOMINAL,
) -> dict[str, np.ndarray]:
  """U (208, 208), s (208,), B^T (208, 128*128) and W (128*128,) of the simulator's
  Jacobian of `system` (float64; zero outside the disk), computed once per process."""
  disk, jd, w_inv, gram = tikhonov.weighted_system(
    tikhonov.default_jacobian(system), noser_exponent
  )
  s, u = np.linalg.eigh((gram + gram.T) / 2)
  s = np.maximum(s, 0.0)
  basis_t = np.zeros((NUM_MEASUREMENTS, disk.size))
  basis_t[:, disk] = u.T @ (jd * w_inv)  # (B^T)[:, disk] = U^T J W^-1
  weight = np.zeros(disk.size)
  weight[disk] = 1.0 / w_inv
  return {"rotation": u, "spectrum": s, "basis_t": basis_t, "weight": weight}


def filters(spectrum: np.ndarray, alphas) -> np.ndarray:
  """(levels, 208) spectral filters 1 / (s + lambda_alpha), lambda = alpha * trace(G) / 208."""
  s = np.asarray(spectrum, np.float64)
  lam = np.asarray(alphas, np.float64)[:, None] * s.sum() / s.size
  return 1.0 / (s[None] + lam)


class LinearConditioner(nnx.Module):
  """EIM (B, 16, 16, 1) of standardised voltages -> (B, 128, 128, levels) linear reconstructions
  of the voltages in simulation units, each divided by its training-set std."""

  def __init__(
    self,
    alphas,
    *,
    noser_exponent: float = tikhonov.NOSER_EXPONENT,
    system: measurement.System = measurement.NOMINAL,
  ):
    if not alphas or any(not a > 0 for a in alphas):
      raise InputError(
        f"regularisation levels {tuple(alphas)!r}: give one or more numbers > 0, "
        "e.g. (0.03, 0.3) (config.model.cond_alphas)"
      )
    f = linear_factors(float(noser_exponent), system)
    self.alphas = tuple(float(a) for a in alphas)
    self.rotation = Fixed(jnp.asarray(f["rotation"], jnp.float32))
    self.basis_t = Fixed(jnp.asarray(f["basis_t"], jnp.float32))
    self.weight = Fixed(jnp.asarray(f["weight"], jnp.float32))
    self.filters = Fixed(jnp.asarray(filters(f["spectrum"], self.alphas), jnp.float32))
    # Identity until `calibrate` measures the training set.
    self.voltage_mean = Calibration(jnp.zeros((NUM_MEASUREMENTS,), jnp.float32))
    self.voltage_std = Calibration(jnp.ones((NUM_MEASUREMENTS,), jnp.float32))
    self.scale = Calibration(jnp.ones((len(self.alphas),), jnp.float32))

  def voltages(self, cond: jax.Array) -> jax.Array:
    """(B, 208) voltages in simulation units (ys / voltage_ratio) read back from the EIM."""
    return measurement.voltages_from_eim(
      cond.astype(jnp.float32), self.voltage_mean[...], self.voltage_std[...]
    )

  def reconstruct(self, ys: jax.Array, filt: jax.Array) -> jax.Array:
    """(B, levels, pixels) M_alpha ys for filters (levels, 208)."""
    z = jnp.dot(ys, self.rotation[...], precision="highest")  # U^T y
    return jnp.einsum("bkm,mp->bkp", z[:, None] * filt, self.basis_t[...], precision="highest")

  def forward(self, x: jax.Array) -> jax.Array:
    """J x: (B, 208) linearised voltages of label images x (B, 128, 128[, 1])."""
    flat = x.reshape(x.shape[0], -1).astype(jnp.float32) * self.weight[...]
    return jnp.dot(
      jnp.dot(flat, self.basis_t[...].T, precision="highest"),
      self.rotation[...].T,
      precision="highest",
    )

  def channels(self, cond: jax.Array, scaled: bool = True) -> jax.Array:
    out = self.reconstruct(self.voltages(cond), self.filters[...])
    if scaled:
      out = out * self.scale[...][None, :, None]
    size = int(np.sqrt(out.shape[-1]))
    return jnp.moveaxis(out, 1, -1).reshape(out.shape[0], size, size, -1)

  def __call__(self, cond: jax.Array) -> jax.Array:
    return self.channels(cond)


def calibrate(
  conditioner: LinearConditioner, source, limit: int = CALIBRATION_EXAMPLES, batch: int = 64
) -> np.ndarray:
  """Set the conditioner's voltage statistics to the source's and each channel's scale to 1 / its
  std over the disk on the first `limit` examples of `source` (an `NpzSource`); returns the
  scales."""
  conditioner.voltage_mean[...] = jnp.asarray(np.ravel(source.mean), jnp.float32)
  conditioner.voltage_std[...] = jnp.asarray(np.ravel(source.std), jnp.float32)
  n = min(len(source), limit)
  fn = nnx.jit(lambda m, c: m.channels(c, scaled=False))
  disk = ph.disk_mask(ph.IMAGE_SIZE)
  total = np.zeros(len(conditioner.alphas))
  total_sq = np.zeros(len(conditioner.alphas))
  count = 0
  for lo in range(0, n, batch):
    cond = np.stack([source[i]["cond"] for i in range(lo, min(n, lo + batch))])
    ch = np.asarray(fn(conditioner, jnp.asarray(cond)), np.float64)[:, disk]  # (b, pixels, k)
    total += ch.sum((0, 1))
    total_sq += (ch * ch).sum((0, 1))
    count += ch.shape[0] * ch.shape[1]
  std = np.sqrt(np.maximum(total_sq / count - (total / count) ** 2, 0.0))
  if not np.all(std > 0):
    raise InputError(
      f"{source!r}: the linear reconstructions of its voltages are constant; "
      "cannot scale the conditioning channels"
    )
  scale = (1.0 / std).astype(np.float32)
  conditioner.scale[...] = jnp.asarray(scale)
  return scale


# ----------------------------------------------------------------------------- sampling


class DataConsistency(nnx.Module):
  """The sampler's data-consistency step on the x0 estimate (label units, 128 x 128):

      x0 <- x0 + strength * M_alpha (y - J x0)      (M_alpha is zero outside the disk)

  one regularised Gauss-Newton step of ||J x0 - y||^2 from x0 with the linearised model, the
  measured voltages y (simulation units) read back from the EIM with the given statistics."""

  def __init__(
    self,
    mean,
    std,
    *,
    strength: float = 1.0,
    alpha: float = 0.1,
    noser_exponent: float = tikhonov.NOSER_EXPONENT,
    system: measurement.System = measurement.NOMINAL,
  ):
    if not strength > 0:
      raise InputError(f"data consistency strength must be > 0, got {strength}")
    self.strength = float(strength)
    self.op = LinearConditioner((alpha,), noser_exponent=noser_exponent, system=system)
    self.op.voltage_mean[...] = jnp.asarray(np.ravel(mean), jnp.float32)
    self.op.voltage_std[...] = jnp.asarray(np.ravel(std), jnp.float32)

  def __call__(self, x0: jax.Array, cond: jax.Array) -> jax.Array:
    """Corrected x0 (B, 128, 128, C) given the EIM condition (B, 16, 16, 1)."""
    residual = self.op.voltages(cond) - self.op.forward(x0)
    step = self.op.reconstruct(residual, self.op.filters[...])[:, 0]
    step = step.reshape(x0.shape[:3])
    return x0 + self.strength * step[..., None]
