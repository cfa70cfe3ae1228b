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
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit import measurement, tikhonov
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit import priors as priors_lib
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import NUM_MEASUREMENTS

CALIBRATION_EXAMPLES = 1024  # training examples whose channel std sets the channel scale


def linear_factors(
  lay: Layout, noser_exponent: float = tikhonov.NOSER_EXPONENT
) -> dict[str, np.ndarray]:
  """U (208, 208), s (208,), B^T (208, 128*128) and W (128*128,) of the simulator's
  Jacobian of CDEIT's system with `lay`'s contact impedance (float64; zero outside the disk),
  computed once per process and system."""
  return _linear_factors(float(noser_exponent), lay.physics)


@functools.lru_cache(maxsize=4)
def _linear_factors(noser_exponent: float, physics: Layout) -> dict[str, np.ndarray]:
  disk, jd, w_inv, gram = tikhonov.weighted_system(
    tikhonov.layout_jacobian(physics), noser_exponent
  )
  s, u = np.linalg.eigh((gram + gram.T) / 2)
  s = np.maximum(s, 0.0)
  basis_t = np.zeros((NUM_MEASUREMENTS, disk.size))
  basis_t[:, disk] = u.T @ (jd * w_inv)  # (B^T)[:, disk] = U^T J W^-1
  weight = np.zeros(disk.size)
  weight[disk] = 1.0 / w_inv
  return {"rotation": u, "spectrum": s, "basis_t": basis_t, "weight": weight}


class LinearConditioner(nnx.Module):
  """EIM (B, 16, 16, 1) of standardised voltages -> (B, 128, 128, levels) linear reconstructions
  of the voltages in simulation units, each divided by its training-set std (CDEIT's system, or
  `layout`: the same with another contact impedance)."""

  def __init__(
    self,
    alphas,
    *,
    layout: Layout,
    noser_exponent: float = tikhonov.NOSER_EXPONENT,
  ):
    if not alphas or any(not a > 0 for a in alphas):
      raise InputError(
        f"regularisation levels {tuple(alphas)!r}: give one or more numbers > 0, "
        "e.g. (0.03, 0.3) (config.model.cond_alphas)"
      )
    f = linear_factors(layout, float(noser_exponent))
    self.layout = layout
    self.alphas = tuple(float(a) for a in alphas)
    self.num_channels = len(self.alphas)  # one image per level
    self.rotation = Fixed(jnp.asarray(f["rotation"], jnp.float32))
    self.basis_t = Fixed(jnp.asarray(f["basis_t"], jnp.float32))
    self.weight = Fixed(jnp.asarray(f["weight"], jnp.float32))
    self.filters = Fixed(jnp.asarray(priors_lib.filters(f["spectrum"], self.alphas), jnp.float32))
    # Identity until `calibrate` measures the training set.
    self.voltage_mean = Calibration(jnp.zeros((NUM_MEASUREMENTS,), jnp.float32))
    self.voltage_std = Calibration(jnp.ones((NUM_MEASUREMENTS,), jnp.float32))
    self.scale = Calibration(jnp.ones((self.num_channels,), jnp.float32))

  def voltages(self, cond: jax.Array) -> jax.Array:
    """(B, 208) voltages in simulation units (ys / voltage_ratio) read back from the EIM."""
    return measurement.voltages_from_eim(
      cond.astype(jnp.float32), self.voltage_mean[...], self.voltage_std[...], self.layout
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
  total = np.zeros(conditioner.num_channels)
  total_sq = np.zeros(conditioner.num_channels)
  count = 0
  # A model of any system with no full set among its removal sets sees example i without the
  # electrodes of set i mod K, as training draws one per example (with the full set, whole
  # frames, as they come).
  removed = getattr(conditioner, "removed", None)
  if removed is not None and np.asarray(removed[...]).any(1).all():
    removed = np.asarray(removed[...])
  else:
    removed = None
  for lo in range(0, n, batch):
    cond = np.stack([source[i]["cond"] for i in range(lo, min(n, lo + batch))])
    if removed is not None:
      cond = np.where(removed[np.arange(lo, lo + len(cond)) % len(removed)], np.nan, cond)
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
    layout: Layout,
    strength: float = 1.0,
    alpha: float = 0.1,
    noser_exponent: float = tikhonov.NOSER_EXPONENT,
  ):
    if not strength > 0:
      raise InputError(f"data consistency strength must be > 0, got {strength}")
    self.strength = float(strength)
    self.op = LinearConditioner((alpha,), noser_exponent=noser_exponent, layout=layout)
    self.op.voltage_mean[...] = jnp.asarray(np.ravel(mean), jnp.float32)
    self.op.voltage_std[...] = jnp.asarray(np.ravel(std), jnp.float32)

  def __call__(self, x0: jax.Array, cond: jax.Array) -> jax.Array:
    """Corrected x0 (B, 128, 128, C) given the EIM condition (B, 16, 16, 1)."""
    residual = self.op.voltages(cond) - self.op.forward(x0)
    step = self.op.reconstruct(residual, self.op.filters[...])[:, 0]
    step = step.reshape(x0.shape[:3])
    return x0 + self.strength * step[..., None]


# ----------------------------------------------------------------------------- any system


def pooled_jacobian(jac: np.ndarray, grid: int) -> np.ndarray:
  """(R, grid, grid): the sensitivity of each value to a coarse pixel (the sum over its fine
  pixels) of a Jacobian (R, 128, 128)."""
  f = jac.shape[-1] // grid
  if f * grid != jac.shape[-1]:
    raise InputError(f"cond_grid {grid} must divide the image size {jac.shape[-1]}")
  return np.asarray(jac, np.float64).reshape(len(jac), grid, f, grid, f).sum((2, 4))


def layout_factors(
  lay: Layout,
  removals: str,
  alphas: tuple[float, ...],
  grid: int,
  noser_exponent: float = tikhonov.NOSER_EXPONENT,
  current_carrying: str = "use",
  priors: tuple[str, ...] = ("noser",),
) -> dict[str, np.ndarray]:
  """For each electrode-removal set k of the rule `removals`, each prior of `priors` (`PRIORS`)
  and each level alpha: the regularised linear reconstruction matrix of the values that set
  leaves of the measuring system `lay` (its contact impedance included, as float32 holds it), on
  a coarse `grid` (`disk` pixels), with zero columns for the values it removes (they are left out
  of the system, not read as zeros): `matrices` (K, priors x levels, R, disk pixels) float32,
  prior-major, `removed` (K, R) bool. With
  `current_carrying="drop"` (`CURRENT_CARRYING`) the values measured on a current-carrying
  electrode (`Layout.on_current_carrying`) are left out of every set's system too (`ignored` (R,)).
  lambda = alpha * trace(G) / (values left), as `eit.tikhonov.Tikhonov`. Kept in memory for the
  last two settings (a process builds one model's, or a model's and its evaluation's)."""
  sets = layout_lib.removal_sets(removals)
  beyond = sorted({e for s in sets for e in s if e >= lay.num_electrodes})
  if beyond:
    raise InputError(
      f"electrode removal {removals!r}: electrodes {beyond} are not among {lay.describe()}'s "
      f"0..{lay.num_electrodes - 1} (config.simulator.removals)"
    )
  if current_carrying not in CURRENT_CARRYING:
    raise InputError(
      f"current_carrying {current_carrying!r}: give one of {', '.join(CURRENT_CARRYING)} "
      "(config.model.current_carrying)"
    )
  priors = check_priors(priors)
  ignored = ignored_values(lay, current_carrying)
  empty = [s for s, gone in zip(sets, removed_values(lay, removals)) if (gone | ignored).all()]
  if empty:
    raise InputError(
      f"electrode removal {removals!r}: removing electrodes {list(empty[0])} leaves none of "
      f"{lay.describe()}'s values"
      + (
        " off the current-carrying electrodes (config.model.current_carrying)"
        if ignored.any()
        else " (config.simulator.removals)"
      )
    )
  physics = lay.with_contact_impedance(float(np.float32(lay.z))).physics
  return _layout_factors(
    physics, removals, tuple(alphas), grid, float(noser_exponent), current_carrying, priors
  )


# What the linear reconstructions do with the values measured on a current-carrying electrode:
# "use" them as any other, or "drop" them (left out of every system, whatever a frame holds
# there): they carry the contact impedance's drop, which the electrode model fits worst on real
# tanks. configs/device.py drops them (measured on UEF2017's real frames, docs/your_device.md).
CURRENT_CARRYING = ("use", "drop")


def ignored_values(lay: Layout, current_carrying: str) -> np.ndarray:
  """(R,) bool: the values the linear reconstructions leave out whatever a frame holds."""
  if current_carrying == "drop":
    return np.asarray(lay.on_current_carrying, bool)
  return np.zeros(lay.num_values, bool)


def ignored_note(lay: Layout, current_carrying: str) -> str | None:
  """One log line saying which values a model of `lay` leaves out (None: none)."""
  n = int(ignored_values(lay, current_carrying).sum())
  if not n:
    return None
  return (
    f"the model's linear images leave out the {n} of {lay.num_values} values measured on "
    f"current-carrying electrodes (config.model.current_carrying={current_carrying!r})"
  )


# The priors of the linear images (config.model.cond_priors), each at every level alpha, after
# KTC2023's winners, who stacked linearised reconstructions of several priors as the network's
# input channels: NOSER-weighted Tikhonov, a smoothness penalty on the image's graph Laplacian, a
# Gaussian prior (`eit.priors`: what each is, and its matrices).
PRIORS = ("noser", "laplace", "smooth")


def check_priors(priors) -> tuple[str, ...]:
  """`priors` as a tuple of known, distinct names; an InputError naming the config key."""
  if isinstance(priors, str):
    priors = (priors,)
  priors = tuple(str(p) for p in (priors or ()))
  bad = [p for p in priors if p not in PRIORS]
  if not priors or bad or len(set(priors)) != len(priors):
    raise InputError(
      f"config.model.cond_priors: {priors!r} must be one or more distinct names of {PRIORS}, "
      'e.g. ("noser",) or ("noser", "laplace", "smooth")'
    )
  return priors


@functools.lru_cache(maxsize=2)
def _layout_factors(
  lay: Layout,
  removals: str,
  alphas: tuple[float, ...],
  grid: int,
  noser_exponent: float,
  current_carrying: str,
  priors: tuple[str, ...] = ("noser",),
) -> dict[str, np.ndarray]:
  jac = pooled_jacobian(tikhonov.layout_jacobian(lay), grid)
  disk = ph.disk_mask(grid).reshape(-1)
  removed = removed_values(lay, removals)
  ignored = ignored_values(lay, current_carrying)
  levels = len(alphas)
  out = np.zeros((len(removed), len(priors) * levels, lay.num_values, int(disk.sum())), np.float32)
  for k, gone in enumerate(removed | ignored):
    for p, prior in enumerate(priors):
      m = priors_lib.prior_matrices(jac[~gone], prior, alphas, noser_exponent)
      for a in range(levels):
        out[k, p * levels + a][~gone] = m[a].T
  return {"matrices": out, "removed": removed, "ignored": ignored, "disk": disk}


def removed_values(lay: Layout, removals: str) -> np.ndarray:
  """(K, R) bool: the values each electrode set of the removal rule `removals` takes from the
  measuring system `lay` (`eit.layout.Layout.without`)."""
  return np.stack([lay.without(s) for s in layout_lib.removal_sets(removals)])


class LayoutConditioner(nnx.Module):
  """Standardised voltages (B, R) of any measuring system (`layout`: an `eit.layout.Layout`, its
  contact impedance included, or a preset's name or device file), NaN where a value is
  missing -> (B, 128, 128, levels) linear reconstructions in simulation units, each divided by
  its training-set std. A frame's missing values must be those of one of the removal rule's
  electrode sets (`eit.layout.removal_sets`); that set's matrices reconstruct it from the values
  it has. A frame that fits no set gets NaN channels (callers check first: `removal_set`).
  `current_carrying="drop"`: the values on current-carrying electrodes are left out of every
  set's reconstruction (`ignored`), as if missing, whatever a frame holds there.

  One channel per prior of `priors` (`PRIORS`) and level of `alphas`, prior-major. The
  reconstructions are made on a coarse grid (`grid` x `grid`, bilinearly upsampled): one
  (R x pixels) matrix per set, prior and level is 7 x 2 x 2,356 x 812 floats (107 MB) for KTC2023
  at grid 32 with one prior and two levels; at 128 it would be 2.2 GB."""

  def __init__(
    self,
    layout,
    alphas,
    *,
    removals: str = "none",
    grid: int = 32,
    noser_exponent: float = tikhonov.NOSER_EXPONENT,
    current_carrying: str = "use",
    priors: tuple[str, ...] = ("noser",),
  ):
    if not alphas or any(not a > 0 for a in alphas):
      raise InputError(
        f"regularisation levels {tuple(alphas)!r}: give one or more numbers > 0, "
        "e.g. (0.03, 0.3) (config.model.cond_alphas)"
      )
    self.alphas = tuple(float(a) for a in alphas)
    self.priors = check_priors(priors)
    self.num_channels = len(self.priors) * len(self.alphas)  # prior-major
    self.layout = layout_lib.as_layout(layout)
    f = layout_factors(
      self.layout, removals, self.alphas, grid, noser_exponent, current_carrying, self.priors
    )
    self.grid = grid
    k, a, self.num_values, p = f["matrices"].shape
    # (R, K * levels * pixels): one matrix product makes every set's images, with no copy of
    # the matrices inside the step (a transposed view would be copied on every call)
    self.matrices = Fixed(
      jnp.asarray(np.ascontiguousarray(f["matrices"].transpose(2, 0, 1, 3)).reshape(-1, k * a * p))
    )
    self.num_sets = k
    self.removed = Fixed(jnp.asarray(f["removed"]))
    self.ignored = Fixed(jnp.asarray(f["ignored"]))  # left out whatever a frame holds there
    self.disk_index = Fixed(jnp.asarray(np.flatnonzero(f["disk"]), jnp.int32))
    self.voltage_mean = Calibration(jnp.zeros((self.num_values,), jnp.float32))
    self.voltage_std = Calibration(jnp.ones((self.num_values,), jnp.float32))
    self.scale = Calibration(jnp.ones((self.num_channels,), jnp.float32))

  def remove_at_random(self, cond: jax.Array, key: jax.Array) -> jax.Array:
    """`cond` (B, R) with the values of one removal set per example, drawn uniformly, set to
    NaN (training: the model meets every set it will be used with)."""
    k = jax.random.randint(key, (cond.shape[0],), 0, self.removed.shape[0])
    return jnp.where(self.removed[...][k], jnp.nan, cond)

  def _fits(self, cond: jax.Array) -> tuple[jax.Array, jax.Array]:
    """((B, R) missing or ignored values, (B, K) whether each removal set is a frame's)."""
    ignored = self.ignored[...]
    missing = jnp.isnan(cond) | ignored
    return missing, jnp.all(missing[:, None] == (self.removed[...] | ignored)[None], axis=-1)

  def set_index(self, cond: jax.Array) -> jax.Array:
    """(B,) int32: each frame's removal set (the first that fits; 0 for a frame that fits
    none, whose channels are NaN)."""
    return jnp.argmax(self._fits(cond)[1], axis=1).astype(jnp.int32)

  def coarse(self, cond: jax.Array, scaled: bool = True) -> jax.Array:
    """(B, channels, disk pixels of the coarse grid): each frame's reconstructions by its
    removal set's matrices (NaN for a frame that fits no set)."""
    cond = cond.astype(jnp.float32)
    missing, fits = self._fits(cond)  # (B, K)
    v = jnp.where(missing, 0.0, cond * self.voltage_std[...] + self.voltage_mean[...])
    k, a = self.num_sets, self.num_channels
    each = jnp.dot(v, self.matrices[...], precision="highest").reshape(v.shape[0], k, a, -1)
    first = fits & (jnp.cumsum(fits, axis=1) == 1)
    out = jnp.einsum("bk,bkap->bap", first.astype(jnp.float32), each)
    out = jnp.where(fits.any(1)[:, None, None], out, jnp.nan)
    if scaled:
      out = out * self.scale[...][None, :, None]
    return out

  def channels(self, cond: jax.Array, scaled: bool = True) -> jax.Array:
    out = self.coarse(cond, scaled)
    (b, a, _), g = out.shape, self.grid
    img = jnp.zeros((b, a, g * g), jnp.float32).at[..., self.disk_index[...]].set(out)
    img = jax.image.resize(img.reshape(b, a, g, g), (b, a, 128, 128), "linear")
    img = img * jnp.asarray(ph.disk_mask(ph.IMAGE_SIZE), jnp.float32)
    return jnp.moveaxis(img, 1, -1)

  def __call__(self, cond: jax.Array) -> jax.Array:
    return self.channels(cond)


def removal_set(removed: np.ndarray, frames: np.ndarray, where: str) -> np.ndarray:
  """The index of each frame's removal set (rows of `removed` (K, R)) from its NaN values;
  an InputError naming `where` and the frame when one fits no set."""
  missing = ~np.isfinite(np.asarray(frames))
  fits = np.all(missing[:, None] == np.asarray(removed)[None], axis=-1)
  bad = np.flatnonzero(~fits.any(1))
  if bad.size:
    raise InputError(
      f"{where}: frame {int(bad[0])} misses {int(missing[bad[0]].sum())} values, which is none "
      f"of the {len(removed)} electrode-removal sets the model was trained with "
      "(config.simulator.removals); train a model with this device's removals"
    )
  return np.argmax(fits, axis=1)
