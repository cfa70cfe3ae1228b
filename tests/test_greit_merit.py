"""The GREIT figures of merit (infer.greit_merit through metrics.greit_figures): analytic images
on an 8 x 8 grid against hand values, EIDORS' and pyEIT's definitions, and pyEIT's own
`calc_greit_figures_of_merit` (its logic transcribed below) on the same images."""

import math

import numpy as np
import pytest
from scipy import ndimage as ndi

from cdeit_jax.eit import phantom
from cdeit_jax.infer import metrics

MEDIUM = phantom.disk_mask(8)  # 52 pixels; pixel centres at +-0.125, +-0.375, +-0.625, +-0.875


def _image(ones, value=1.0, others=()):
  """An 8 x 8 image: `value` at the (row, col) pixels `ones`, each (row, col, v) of `others`."""
  img = np.zeros((8, 8))
  for rc in ones:
    img[rc] = value
  for r, c, v in others:
    img[r, c] = v
  return img


CENTRE = [(3, 3), (3, 4), (4, 3), (4, 4)]  # x, y in {-0.125, 0.125}
BLOCK = [(r, c) for r in range(2, 6) for c in range(2, 6)]  # x, y in {+-0.125, +-0.375}
RING = [rc for rc in BLOCK if rc not in CENTRE]
DISC = _image(CENTRE)
RING_IMAGE = _image(RING, others=[(r, c, -0.5) for r, c in CENTRE])
SHIFTED = _image([(3, 5), (3, 6), (4, 5), (4, 6)], others=[(4, 1, 0.2)])  # x in {0.375, 0.625}


def _figures(images, positions, truths=None, definition="eidors"):
  out = metrics.greit_figures(np.stack(images), np.asarray(positions), MEDIUM, truths, definition)
  return [{k: float(v[i]) for k, v in out.items()} for i in range(len(images))]


def test_eidors_figures_of_a_disc_a_ring_and_a_shifted_disc_by_hand():
  """The disc at the centre: AR its sum 4, no position error, RES sqrt(4 / 52), inside its
  equivalent circle, no ringing. The ring of 12 around a negative centre (-0.5 x 4): AR 12 - 2,
  its centre of gravity at the centre (PE = |(0.25, 0)| = 0.25), its 4 corners (squared
  distance 0.28) outside the circle of its area (r^2 = 12 / 16 / pi = 0.24): SD 1/3, ringing
  2 / 12. The disc shifted to x = 0.5, with a positive pixel (0.2) below the quarter amplitude:
  PE 0.45 - 0.5, AR 4.2, none outside."""
  disc, ring, shifted = _figures([DISC, RING_IMAGE, SHIFTED], [(0, 0), (0.25, 0), (0.45, 0)])
  assert disc == pytest.approx({"AR": 4, "PE": 0, "RES": math.sqrt(4 / 52), "SD": 0, "RNG": 0})
  assert ring == pytest.approx(
    {"AR": 10, "PE": 0.25, "RES": math.sqrt(12 / 52), "SD": 1 / 3, "RNG": 1 / 6}
  )
  assert shifted == pytest.approx(
    {"AR": 4.2, "PE": -0.05, "RES": math.sqrt(4 / 52), "SD": 0, "RNG": 0}
  )


def test_eidors_amplitude_of_more_than_ten_images_is_relative_to_the_centre_targets():
  """12 discs scaled 1 .. 12, the first three within 0.05 of the centre: AR_i = 4 i / mean(4, 8,
  12); with 10 images, none is normalised (EIDORS normalises more than 10 only)."""
  scales = np.arange(1, 13)
  r = np.r_[0.0, 0.02, 0.04, np.linspace(0.1, 0.9, 9)]
  pos = np.stack([r, 0 * r], 1)
  got = metrics.greit_figures(scales[:, None, None] * DISC, pos, MEDIUM)["AR"]
  np.testing.assert_allclose(got, scales / 2.0)
  got10 = metrics.greit_figures(scales[:10, None, None] * DISC, pos[:10], MEDIUM)["AR"]
  np.testing.assert_allclose(got10, 4.0 * scales[:10])


def test_pyeit_figures_of_the_same_images_by_hand():
  """pyEIT's variant in pixels: AR the mean over the 52 pixels; PE between centres of mass from
  the medium's centre (3.5, 3.5), over the widest axis (8): the shifted image's centre (3.5,
  5.5) is one pixel beyond its truth's (3.5, 4.5), so PE = (1 - 2) / 8; RES, SD and RNG as
  EIDORS'."""
  truths = np.stack([DISC, DISC, _image([(3, 4), (3, 5), (4, 4), (4, 5)])])
  disc, ring, shifted = _figures(
    [DISC, RING_IMAGE, SHIFTED], [(0, 0), (0.25, 0), (0.45, 0)], truths, "pyeit"
  )
  assert disc == pytest.approx({"AR": 4 / 52, "PE": 0, "RES": math.sqrt(4 / 52), "SD": 0, "RNG": 0})
  assert ring == pytest.approx(
    {"AR": 10 / 52, "PE": 0, "RES": math.sqrt(12 / 52), "SD": 1 / 3, "RNG": 1 / 6}
  )
  assert shifted == pytest.approx(
    {"AR": 4.2 / 52, "PE": -1 / 8, "RES": math.sqrt(4 / 52), "SD": 0, "RNG": 0}
  )


def test_no_target_gives_no_figures_but_amplitude():
  (f,) = _figures([-DISC], [(0, 0)])
  assert f["AR"] == -4 and all(math.isnan(f[k]) for k in ("PE", "RES", "SD", "RNG"))


# ---------------------------------------------------------------------------------------------
# pyEIT's `calc_greit_figures_of_merit` (eitcom/pyEIT, pyeit/quality/merit.py at 3ed2fca, BSD
# licence: the logic of its default path, conductive targets, GREIT fraction method, rewritten
# here as a second implementation). The released pyeit 1.2.4 on PyPI predates it (its merit.py
# of 2022 sums the amplitude and measures PE from the array's corner), so its function cannot
# be called here.


def _pyeit_fractional_set(image, fraction=0.25):
  max_amplitude = np.nanmax(image)
  threshold = np.abs(max_amplitude * fraction)
  out = np.full(np.shape(image), np.nan)
  with np.errstate(invalid="ignore"):
    out[image < threshold] = 0
    out[image >= threshold] = 1
  return out


def _pyeit_bounds(image):
  rowmin = np.argmax(np.any(~np.isnan(image), axis=0))
  rowmax = image.shape[0] - np.argmax(np.any(~np.isnan(image[::-1]), axis=0))
  colmin = np.argmax(np.any(~np.isnan(image), axis=1))
  colmax = image.shape[1] - np.argmax(np.any(~np.isnan(image[::-1]), axis=1))
  return rowmin, rowmax, colmin, colmax


def pyeit_calc_greit_figures_of_merit(target_image, reconstruction_image):
  amplitude = np.sum(np.nan_to_num(reconstruction_image, nan=0)) / np.count_nonzero(
    ~np.isnan(reconstruction_image)
  )
  rowmin, rowmax, colmin, colmax = _pyeit_bounds(target_image)
  major = max(rowmax - rowmin, colmax - colmin)
  frac = _pyeit_fractional_set(reconstruction_image)
  recon_center = ndi.center_of_mass(np.nan_to_num(frac, nan=0))
  target = ~np.isnan(target_image) & np.isclose(target_image, np.nanmax(target_image), rtol=0.001)
  target_center = ndi.center_of_mass(target)
  medium_center = ndi.center_of_mass(np.nan_to_num(_pyeit_fractional_set(target_image, 0), nan=0))
  r_target = math.dist(target_center, medium_center)
  r_recon = math.dist(recon_center, medium_center)
  position_error = (r_target - r_recon) / major
  area = np.count_nonzero(frac == 1)
  resolution = math.sqrt(area / np.count_nonzero(~np.isnan(frac)))
  cx, cy = ndi.center_of_mass(np.nan_to_num(frac, nan=0))
  circle = np.zeros(frac.shape)
  for i in range(circle.shape[0]):
    for j in range(circle.shape[1]):
      if math.sqrt((cx - i) ** 2 + (cy - j) ** 2) <= math.sqrt(area / math.pi):
        circle[i, j] = 1
  shape_deformation = np.sum(np.logical_and(frac == 1, circle == 0)) / area
  inside = np.sum(reconstruction_image[np.where(frac == 1)])
  with np.errstate(invalid="ignore"):
    opposite = np.logical_and(reconstruction_image < 0, np.logical_not(frac))
  ringing = -1 * np.sum(reconstruction_image[opposite]) / inside
  return amplitude, position_error, resolution, shape_deformation, ringing


def test_pyeits_own_function_agrees_with_the_pyeit_option():
  """Blurred targets with a negative halo and noise at eight places on a 64 x 64 grid (NaN
  outside the medium, as pyEIT takes its images): the five figures of pyEIT's
  `calc_greit_figures_of_merit` equal the pyEIT option's."""
  rng = np.random.default_rng(3)
  medium = phantom.disk_mask(64)
  yy, xx = np.mgrid[0:64, 0:64]
  images, truths = [], []
  for _ in range(8):
    r, th = rng.uniform(0, 0.8), rng.uniform(0, 2 * np.pi)
    cr, cc = 31.5 + 32 * r * np.sin(th), 31.5 + 32 * r * np.cos(th)
    d2 = (yy - cr) ** 2 + (xx - cc) ** 2
    img = np.exp(-d2 / 30) - 0.3 * np.exp(-d2 / 200) + 0.02 * rng.standard_normal((64, 64))
    images.append(np.where(medium, img, np.nan))
    truths.append(np.where(medium, (d2 <= 9).astype(float), np.nan))
  ours = metrics.greit_figures(
    np.stack(images), np.zeros((8, 2)), medium, np.stack(truths), "pyeit"
  )
  for i in range(8):
    theirs = pyeit_calc_greit_figures_of_merit(truths[i], images[i])
    got = [ours[f.name][i] for f in metrics.GREIT]
    np.testing.assert_allclose(got, theirs, rtol=1e-10, atol=1e-12)
