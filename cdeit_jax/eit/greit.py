"""GREIT (Adler et al., Physiol. Meas. 30, 2009): the linear reconstruction designed for a desired
image and a noise figure, on the 128 x 128 grid of a measuring system's Jacobian.

    R = D J^T (J J^T + lambda S_n)^-1,    S_n = diag(J J^T)^p

is the distribution form of GREIT's training (every pixel inside the disk a small target of its
own, as pyEIT's `GREIT(method="dist")` and Grychtol et al.'s 3-D GREIT take it): J (R values,
pixels) is the Jacobian with respect to the label image (`tikhonov.jacobian`), D the desired
image of a unit change at each pixel, a sigmoid disc 1 / (1 + exp(s (|r - r0| - radius))) of
`DESIRED_RADIUS` (EIDORS' tutorial's 0.2 of the tank's radius, steepness 10 / radius as EIDORS'
`GREIT_desired_img_sigmoid`), normalised over the pixels for each output pixel (pyEIT's
`weight_sigmod`: a constant change is imaged constant), and S_n the noise's covariance (p = 0:
white noise, the simulator's). lambda is chosen, as EIDORS' `mk_GREIT_model` with
`opt.noise_figure`, so that the noise figure (`noise_figure`) of the centre target of radius
0.05 is `NOISE_FIGURE` (0.5). With pyEIT's desired images and p the matrix is pyEIT's
(`reconstruction_matrix`, checked on pyEIT's own mesh and Jacobian in tests/test_greit.py).
Outputs are in label units, zero outside the disk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout, phantom, simulator, tikhonov
from cdeit_jax.eit.spec import MAX_INCLUSIONS, ROW

DESIRED_RADIUS = 0.2  # the desired image's radius, in units of the tank's radius
NOISE_FIGURE = 0.5  # the noise figure the weight is chosen for (EIDORS' GREIT tutorial's)
TARGET_RADIUS = 0.05  # GREIT's small targets (the test's and the noise figure's)
TARGET_LABEL = 1.0  # their label: sigma = 10 sigma_bg (a conductive target, as GREIT's)
NOISE_DRAWS, NOISE_SEED, NOISE_SNR_DB = 64, 0, 40.0  # the noise figure's draws


def target_params(positions: np.ndarray, radius: float = TARGET_RADIUS, label=TARGET_LABEL):
  """Phantoms (N, MAX_INCLUSIONS, ROW) of one disc each at `positions` (N, 2)."""
  p = np.zeros((len(positions), MAX_INCLUSIONS, ROW), np.float32)
  p[:, 0, 0] = 1.0  # active; kind 0: a disc
  p[:, 0, 2:4] = positions
  p[:, 0, 4] = radius
  p[:, 0, phantom.V] = label
  return p


def target_voltages(lay: layout.Layout, params: np.ndarray) -> np.ndarray:
  """Noise-free difference values (N, R) of phantoms measured by `lay` (simulation units)."""
  sim = simulator.default_simulator(layout=lay)
  return np.asarray(sim.phantom_voltages(jax.numpy.asarray(params)), np.float64)


def noise_draws(
  lay: layout.Layout,
  y0: np.ndarray,
  snr_db: float = NOISE_SNR_DB,
  count: int = NOISE_DRAWS,
  seed: int = NOISE_SEED,
) -> np.ndarray:
  """(count, R) draws of the simulator's noise at `snr_db` on the difference values `y0` (R,)
  measured by `lay`: `simulator.add_noise` on the target's voltages and the reference's, draw k
  from fold_in(key(seed), k) as `Simulator.difference` draws an example's."""
  sim = simulator.default_simulator(layout=lay)
  vh = np.asarray(sim.vh, np.float64)
  vi = vh + y0

  def one(k):
    key = jax.random.fold_in(jax.random.key(seed), k)
    noisy = lambda v, i: simulator.add_noise(
      jax.numpy.asarray(v), snr_db, jax.random.fold_in(key, i)
    )
    return np.asarray(noisy(vi, 0), np.float64) - np.asarray(noisy(vh, 1), np.float64) - y0

  return np.stack([one(k) for k in range(count)])


def noise_figure(
  y0: np.ndarray, noise: np.ndarray, x0: np.ndarray, noisy_images: np.ndarray, medium: np.ndarray
) -> float:
  """EIDORS' noise figure (`calc_noise_figure`): SNR(data) / SNR(image), SNR(data) = mean |y0|
  / mean_k std(noise_k), SNR(image) = mean |x0| / mean_k std(x_k - x0) over the medium, for a
  target's values `y0` (R,) (NaN: left out), noise draws (K, R), its image `x0` (H, W) and the
  images (K, H, W) of y0 + noise_k (MATLAB's std, ddof 1). For a linear method x_k - x0 is the
  image of the noise alone, as EIDORS takes it."""
  y0, noise = np.asarray(y0, np.float64), np.asarray(noise, np.float64)
  keep = np.isfinite(y0)
  medium = np.asarray(medium, bool)
  x0 = np.asarray(x0, np.float64)[medium]
  dx = np.asarray(noisy_images, np.float64)[:, medium] - x0
  snr_data = np.abs(y0[keep]).mean() / noise[:, keep].std(axis=1, ddof=1).mean()
  snr_image = np.abs(x0).mean() / dx.std(axis=1, ddof=1).mean()
  return float(snr_data / snr_image)


def _sigmoid(d: np.ndarray, radius: float, steepness: float) -> np.ndarray:
  return 0.5 * (1 - np.tanh(0.5 * steepness * (d - radius)))  # 1 / (1 + exp(s (d - r)))


def desired_weights(centres: np.ndarray, grid: np.ndarray, radius: float, steepness: float):
  """(E, G) the desired images of a unit change at each of `centres` (E, 2) on the points
  `grid` (G, 2): the sigmoid disc of `radius`, normalised over the centres for each point
  (pyEIT's `weight_sigmod` with its radius ratio * d_max and 5 s / d_max given as `radius` and
  `steepness`)."""
  d = np.linalg.norm(centres[:, None, :2] - grid[None, :, :2], axis=-1)
  w = _sigmoid(d, radius, steepness)
  return w / w.sum(axis=0)


class PixelBlur:
  """`desired_weights` on the pixels inside the disk of a size x size grid (centres and points
  alike), applied by FFT convolution: the sigmoid depends on the distance alone, so the (E, E)
  matrix (1.3 GB at 128 x 128) is never made."""

  def __init__(self, size: int, radius: float, steepness: float):
    from scipy import signal

    self.size, self.disk = size, phantom.disk_mask(size)
    offsets = np.arange(-(size - 1), size) * (2 / size)  # pixel steps in units of the radius
    self.kernel = _sigmoid(np.hypot(*np.meshgrid(offsets, offsets)), radius, steepness)
    self._conv = lambda a: signal.fftconvolve(a, self.kernel[None], mode="same", axes=(-2, -1))
    self.norm = self._conv(self.disk[None].astype(np.float64))[0][self.disk]

  def __call__(self, values: np.ndarray, chunk: int = 32) -> np.ndarray:
    """(E, K) changes at the disk's pixels -> (E, K) their desired images there."""
    out = np.empty_like(values, dtype=np.float64)
    for lo in range(0, values.shape[1], chunk):
      part = values[:, lo : lo + chunk]
      img = np.zeros((part.shape[1], self.size, self.size))
      img[:, self.disk] = part.T
      out[:, lo : lo + chunk] = (self._conv(img)[:, self.disk] / self.norm).T
    return out


def reconstruction_matrix(
  jac: np.ndarray, desired, lam: float, noise_exponent: float = 0.0
) -> np.ndarray:
  """(G, R) R = D J^T (J J^T + lam diag(J J^T)^p)^-1 of a Jacobian (R, E): `desired` the (E, G)
  desired images, or a function taking (E, K) to (G, K)."""
  jac = np.asarray(jac, np.float64)
  gram = jac @ jac.T
  apply = desired if callable(desired) else (lambda v: np.asarray(desired).T @ v)
  return apply(jac.T) @ np.linalg.inv(gram + lam * np.diag(np.diag(gram) ** noise_exponent))


class Greit:
  """The GREIT reconstruction of a Jacobian `jac` (R, 128, 128) (module docstring), its weight
  chosen so that the centre target's noise figure is `noise_figure`, for that target's values
  `y0` (R,) and noise draws `noise` (K, R); call it on values (..., R) in simulation units."""

  def __init__(
    self,
    jac: np.ndarray,
    y0: np.ndarray,
    noise: np.ndarray,
    radius: float = DESIRED_RADIUS,
    noise_figure: float = NOISE_FIGURE,
    noise_exponent: float = 0.0,
  ):
    size = jac.shape[-1]
    self.disk = phantom.disk_mask(size)
    jd = np.asarray(jac, np.float64).reshape(len(jac), -1)[:, self.disk.reshape(-1)]
    gram = jd @ jd.T
    self._blurred = PixelBlur(size, radius, 10.0 / radius)(jd.T)  # D J^T (pixels, R)
    self._gram, self._cov = gram, np.diag(np.diag(gram) ** noise_exponent)
    self._scale = np.trace(gram) / np.trace(self._cov)
    self.alpha = self._choose(y0, noise, noise_figure)
    self.lam = self.alpha * self._scale  # reconstruction_matrix's lam
    self._factor = self._factorised(self.alpha)
    self.noise_figure = self._figure(self._factor, y0, noise)

  def _factorised(self, alpha: float):
    """The LU factors of J J^T + lambda S_n: the (pixels, R) matrix R is never formed (KTC2023's
    2,356 values: 71 GFLOP a weight), each image costs D J^T times one solve."""
    from scipy import linalg

    return linalg.lu_factor(self._gram + alpha * self._scale * self._cov)

  def _inside(self, factor, ys: np.ndarray) -> np.ndarray:
    """(N, disk pixels) the images of values (N, R)."""
    from scipy import linalg

    return (self._blurred @ linalg.lu_solve(factor, ys.T)).T

  def _figure(self, factor, y0: np.ndarray, noise: np.ndarray) -> float:
    image = lambda v: self._image(self._inside(factor, v))
    return noise_figure(y0, noise, image(y0[None])[0], image(y0 + noise), self.disk)

  def _image(self, inside: np.ndarray) -> np.ndarray:
    out = np.zeros(inside.shape[:-1] + self.disk.shape)
    out[..., self.disk] = inside
    return out

  def _choose(self, y0, noise, target: float) -> float:
    """The weight alpha (lambda = alpha tr(J J^T) / tr(S_n)) giving noise figure `target`: the
    least one (the noise figure falls from the unregularised inverse's and may rise again once
    the blurred back-projection dominates), found on log10(alpha) from 1e-10 to 1e6 as EIDORS'
    `bounded_search` finds it."""
    from scipy import optimize

    f = lambda log_a: self._figure(self._factorised(10.0**log_a), y0, noise) - target
    grid = np.arange(-10.0, 7.0)
    values = [f(a) for a in grid]
    for i in range(len(grid) - 1):
      if values[i] > 0 >= values[i + 1]:
        return float(10.0 ** optimize.brentq(f, grid[i], grid[i + 1], xtol=1e-4))
    raise InputError(
      f"GREIT: no weight gives a noise figure of {target} on this system (from "
      f"{min(values) + target:.3g} to {max(values) + target:.3g}); give another noise figure"
    )

  def __call__(self, ys) -> np.ndarray:
    """Images (..., 128, 128) from difference values (..., R) or (..., R, 1)."""
    ys = np.asarray(ys, np.float64)
    r = self._blurred.shape[1]
    if ys.shape[-1] == 1 and ys.ndim >= 2 and ys.shape[-2] == r:
      ys = ys[..., 0]
    if ys.shape[-1] != r:
      raise InputError(f"expected {r} values in the last axis, got shape {ys.shape}")
    flat = self._inside(self._factor, ys.reshape(-1, r))
    return self._image(flat.reshape(*ys.shape[:-1], -1)).astype(np.float32)


def of_values(lay: layout.Layout, present: np.ndarray | None = None) -> Callable:
  """The one GREIT reconstruction of a measuring system from its values `present` (R,) bool
  (default: all), a function of difference values (..., R) in simulation units whose other
  values are left out; kept for the last four (system, values) pairs."""
  keep = np.ones(lay.num_values, bool) if present is None else np.asarray(present, bool)
  return _of_values(lay.physics, keep.tobytes())


@functools.lru_cache(maxsize=4)
def _of_values(physics: layout.Layout, keep_bytes: bytes) -> Callable:
  keep = np.frombuffer(keep_bytes, bool)
  centre = target_params(np.zeros((1, 2)))
  y0 = target_voltages(physics, centre)[0]
  noise = noise_draws(physics, y0)[:, keep]
  y0 = y0[keep]
  g = Greit(tikhonov.layout_jacobian(physics)[keep], y0, noise)
  return lambda ys: g(np.asarray(ys)[..., keep])
