"""The tank's turns and mirror as permutations of a device's values: for any measuring system
(`eit.layout.Layout`), found from its geometry (its electrodes, patterns and pairs mapped onto their
images), with the signs the images' patterns and pairs give. `eit.symmetry` turns examples and
samples with them; `has_symmetries` says whether a device has all 8 (configs/device.py reads it
without JAX)."""

from __future__ import annotations

import functools

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.layout import Layout

# The tank's symmetries that map the pixel grid onto itself (`eit.symmetry`): (quarter turns,
# mirrored), found for any device from its geometry.
GROUP = tuple((q, m) for m in (False, True) for q in range(4))  # (quarter turns, mirrored)


@functools.lru_cache(maxsize=64)
def turn(quarter_turns: int, mirrored: bool, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
  """(index, sign) with `ys[..., index] * sign` the values of the tank mirrored (first, if
  `mirrored`) and turned clockwise by `quarter_turns` quarter turns, for `ys` in the device's
  order. Found from the geometry: electrode e at angle a goes
  to the electrode at the image of a, its patterns and pairs with it; an InputError for a device
  whose electrodes, patterns or pairs have no images among its own."""
  a = np.asarray(lay.angles, np.float64)
  image_of = (np.pi - a if mirrored else a) - quarter_turns * np.pi / 2
  gap = np.abs(np.angle(np.exp(1j * (image_of[:, None] - a[None, :]))))  # (E, E)
  to = np.argmin(gap, 1)
  problem = None
  if gap[np.arange(len(a)), to].max() > 1e-6 or len(set(to)) != len(a):
    problem = "its electrodes do not map onto one another"
  else:
    moved = np.zeros_like(lay.currents)
    moved[to] = lay.currents  # pattern p's currents on the turned tank's electrodes
    pattern, p_sign = np.empty(lay.num_patterns, np.int64), np.empty(lay.num_patterns)
    free = np.ones(lay.num_patterns, bool)  # a device may repeat a pattern (KTC2023 does)
    for p in range(lay.num_patterns):
      for s in (1.0, -1.0):
        same = np.all(np.abs(lay.currents - s * moved[:, p : p + 1]) < 1e-9, 0)
        hit = np.flatnonzero(same & free)
        if hit.size:
          pattern[p], p_sign[p], free[hit[0]] = hit[0], s, False
          break
      else:
        problem = f"pattern {p} has no image among its patterns"
        break
  if problem is None:
    where = {tuple(r): i for i, r in enumerate(lay.rows.tolist())}
    index = np.empty(lay.num_values, np.int64)
    sign = np.empty(lay.num_values, np.float32)
    for i, (p, plus, minus) in enumerate(lay.rows.tolist()):
      q, a_, b_ = int(pattern[p]), int(to[plus]), int(to[minus])
      j, m_sign = (where.get((q, a_, b_)), 1.0)
      if j is None:
        j, m_sign = (where.get((q, b_, a_)), -1.0)
      if j is None:
        problem = f"value {i}'s pair has no image among its values"
        break
      index[j], sign[j] = i, p_sign[p] * m_sign
  if problem is not None:
    raise InputError(
      f"{lay.describe()}: the tank's turns and mirror are not symmetries of this device "
      f"({problem}); set config.data.augment=False and config.sampling.symmetric=False"
    )
  for arr in (index, sign):
    arr.setflags(write=False)
  return index.astype(np.int32), sign


def has_symmetries(lay: Layout) -> bool:
  """Whether the tank's 8 turns and mirrors (`GROUP`) are symmetries of the device `lay`
  (`turn`): what symmetric sampling and augmentation need."""
  try:
    for q, m in GROUP:
      turn(q, m, lay)
  except InputError:
    return False
  return True


def offset(model: Layout, device: Layout, tolerance: float = 1e-6) -> float | None:
  """The angle (radians, counter-clockwise) by which `device`'s electrodes are `model`'s turned,
  all by one angle, with the same widths, current directions and rows; 0.0 at the same angles;
  None when they differ otherwise. In a round tank a frame of such a device is the model's
  frame of the object turned back by it, so the model's image turned by it is the device's
  (`infer.reconstructor.Reconstruction.turned`)."""
  if not (model.measures_as(device) and abs(float(model.width) - float(device.width)) < tolerance):
    return None
  gap = np.angle(np.exp(1j * (np.asarray(device.angles) - np.asarray(model.angles))))
  if np.abs(np.angle(np.exp(1j * (gap - gap[0])))).max() > tolerance:
    return None
  return 0.0 if abs(gap[0]) < tolerance else float(gap[0])


def turn_images(a: np.ndarray, radians: float, axes=(-1, -2), order: int = 1) -> np.ndarray:
  """Images on the label grid (rows growing with +y; `axes`: (x, y)) with their object turned
  counter-clockwise by `radians` about the tank's centre: interpolated at `order` (1 bilinear,
  0 nearest, for class maps), the nearest edge pixel beyond the grid; the dtype kept."""
  from scipy import ndimage

  a = np.asarray(a)
  if radians == 0:
    return a
  # rows grow with +y: a counter-clockwise turn of the object is ndimage's clockwise one
  out = ndimage.rotate(
    a, -np.rad2deg(radians), axes=axes, reshape=False, order=order, mode="nearest"
  )
  return out.astype(a.dtype)
