"""The GREIT figures of merit of images of small targets (Adler et al., "GREIT: a unified
approach to 2D linear EIT reconstruction of lung images", Physiol. Meas. 30, 2009), numpy on the
host: the functions, which `metrics.GREIT` names and applies (`metrics.greit_figures`).

`eidors` (the default) follows EIDORS' `eval_GREIT_fig_merit.m` on an image zeroed outside the
medium, with q its quarter-amplitude set (the medium's pixels >= 0.25 of the image's largest
value there) and x, y the pixel centres in units of the tank's radius (the simulator's grid:
xs[row, col] at ((col - 63.5) / 64, (row - 63.5) / 64)):
  AR   the sum of the image over the medium; over more than 10 images, divided by the mean AR of
       the targets within 0.05 of the centre
  PE   |target position| - |centre of gravity of q| (positive toward the centre)
  RES  sqrt(#q / #medium)
  SD   the fraction of q outside the circle of q's area centred at q's centre of gravity
       ((x - xm)^2 + (y - ym)^2 < pixel area * #q / pi)
  RNG  -sum(image < 0 outside q) / sum(image in q)
`pyeit` follows pyEIT's `pyeit/quality/merit.py` (`calc_greit_figures_of_merit`, master of
2023, "closer in line to EIDORS"), which differs on purpose: AR is the image's mean over the
medium (no normalisation), PE is taken between centres of mass in pixels from the medium's
centre, the target's being the truth's pixels at its maximum, and divided by the medium's widest
axis in pixels, the equivalent circle is closed (<=) and centred on q's centre in pixels.
Both give NaN but AR for an image without a positive value in the medium (no target).

The noise figure beside them is `eit.greit.noise_figure` (EIDORS' `calc_noise_figure`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

QUARTER = 0.25  # the amplitude set's fraction of the maximum
CENTRE_RADIUS = 0.05  # AR is normalised by the targets this close to the centre (EIDORS)
DEFINITIONS = ("eidors", "pyeit")  # EIDORS' (the figures' functions) and their variants' names


@dataclasses.dataclass
class TargetImage:
  """One image (H, W) of a target at `position` (x, y, in units of the tank's radius) with what
  both definitions read of it, made once (`read`): the medium (H, W) bool, the image zeroed
  outside it, its quarter-amplitude set `q` (EIDORS': >= 0.25 max over the medium; pyEIT's
  fractional set is the same set), the pixel centres `x`, `y` and, for pyEIT's PE, the truth."""

  image: np.ndarray
  medium: np.ndarray
  position: np.ndarray
  q: np.ndarray
  x: np.ndarray
  y: np.ndarray
  truth: np.ndarray | None = None

  @property
  def has_target(self) -> bool:
    return bool(self.q.any())


def pixel_grid(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
  """(x, y) (H, W) of the pixel centres in units of the tank's radius (the simulator's grid)."""
  h, w = shape
  x = (np.arange(w) - (w - 1) / 2) / (w / 2)
  y = (np.arange(h) - (h - 1) / 2) / (h / 2)
  return np.broadcast_to(x[None, :], shape), np.broadcast_to(y[:, None], shape)


def read(image, medium, position, truth=None) -> TargetImage:
  """The `TargetImage` of `image` (NaN outside the medium allowed)."""
  medium = np.asarray(medium, bool)
  img = np.where(medium, np.nan_to_num(np.asarray(image, np.float64)), 0.0)
  peak = img[medium].max()
  q = medium & (img >= QUARTER * peak) if peak > 0 else np.zeros_like(medium)
  x, y = pixel_grid(medium.shape)
  pos = np.asarray(position, np.float64)
  return TargetImage(img, medium, pos, q, x, y, None if truth is None else np.asarray(truth))


def _centre(t: TargetImage) -> tuple[float, float]:
  return float(t.x[t.q].mean()), float(t.y[t.q].mean())


# ----------------------------------------------------------------------------- EIDORS


def amplitude(t: TargetImage) -> float:
  return float(t.image[t.medium].sum())


def position_error(t: TargetImage) -> float:
  if not t.has_target:
    return float("nan")
  xm, ym = _centre(t)
  return float(np.hypot(*t.position) - np.hypot(xm, ym))


def resolution(t: TargetImage) -> float:
  if not t.has_target:
    return float("nan")
  return float(np.sqrt(t.q.sum() / t.medium.sum()))


def shape_deformation(t: TargetImage) -> float:
  if not t.has_target:
    return float("nan")
  xm, ym = _centre(t)
  h, w = t.medium.shape
  pixel_area = (2 / w) * (2 / h)
  circle = (t.x - xm) ** 2 + (t.y - ym) ** 2 < pixel_area * t.q.sum() / np.pi
  return float((t.q & ~circle).sum() / t.q.sum())


def ringing(t: TargetImage) -> float:
  if not t.has_target:
    return float("nan")
  ring = t.image[(t.image < 0) & ~t.q & t.medium]
  return float(-ring.sum() / t.image[t.q].sum())


# ----------------------------------------------------------------------------- pyEIT


def _pixel_centre(mask: np.ndarray) -> np.ndarray:
  """(row, col) centre of mass of a mask, in pixels (scipy.ndimage.center_of_mass's)."""
  rows, cols = np.nonzero(mask)
  return np.array([rows.mean(), cols.mean()])


def pyeit_amplitude(t: TargetImage) -> float:
  return float(t.image[t.medium].mean())


def pyeit_position_error(t: TargetImage) -> float:
  if not t.has_target or t.truth is None:
    return float("nan")
  truth = np.where(t.medium, t.truth, np.nan)
  peak = np.nanmax(truth)
  target = t.medium & np.isclose(truth, peak, rtol=1e-3)
  medium_centre = _pixel_centre(t.medium & (truth >= 0))
  r_target = np.linalg.norm(_pixel_centre(target) - medium_centre)
  r_image = np.linalg.norm(_pixel_centre(t.q) - medium_centre)
  rows, cols = np.nonzero(t.medium)
  widest = max(rows.max() - rows.min(), cols.max() - cols.min()) + 1
  return float((r_target - r_image) / widest)


def pyeit_shape_deformation(t: TargetImage) -> float:
  if not t.has_target:
    return float("nan")
  centre = _pixel_centre(t.q)
  rows, cols = np.indices(t.q.shape)
  circle = np.hypot(rows - centre[0], cols - centre[1]) <= np.sqrt(t.q.sum() / np.pi)
  return float((t.q & ~circle).sum() / t.q.sum())
