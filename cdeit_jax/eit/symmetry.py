"""The symmetries of a circular tank that map the pixel grid onto itself: training augmentation,
and symmetric sampling (each of a frame's samples sees the tank turned or mirrored another way).

For a device whose electrodes the tank's turns and mirror map onto one another (CDEIT's 16: a
quarter turn moves electrode e to e + 4, the mirror x -> -x, the axis through electrode 0, moves e
to -e; KTC2023's 32 likewise), the 128 x 128 grid, centred on the disk, maps onto itself under
both. An example (voltages, image) turned or mirrored is an exact example of the turned or
mirrored tank, so the eight elements of the square's group make eight examples of one simulation.
The values are permuted, each times the signs of its pattern's and its pair's images (CDEIT's
signs cancel: a mirrored pair reverses both the injection and the measurement; KTC2023's
patterns against one electrode keep their direction, so a mirror negates their values); the
image is turned with `np.rot90` (rows grow with +y, docs/reference/eit-conventions.md, so a
quarter turn of the array is a clockwise quarter turn of the tank).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit import measurement
from cdeit_jax.eit import turns as turns_lib

GROUP = turns_lib.GROUP
turn = turns_lib.turn
symmetric = turns_lib.has_symmetries


def permutation(quarter_turns: int, mirrored: bool, lay: layout_lib.Layout) -> np.ndarray:
  """`turn`'s index, for a device whose values keep their signs (CDEIT's)."""
  index, sign = turn(quarter_turns, mirrored, lay)
  if np.any(sign < 0):
    raise InputError(f"{lay.describe()}: use symmetry.turn")
  return index


def _axes(xs) -> tuple[int, int]:
  return (-3, -2) if xs.ndim >= 3 and xs.shape[-1] == 1 else (-2, -1)


def image(xs: np.ndarray, quarter_turns: int, mirrored: bool) -> np.ndarray:
  """`xs` (..., H, W[, 1]) (numpy or jax) as `permutation(quarter_turns, mirrored, lay)` sees its
  tank: mirrored (columns reversed), then turned clockwise."""
  xp, axes = (np if isinstance(xs, np.ndarray) else jnp), _axes(xs)
  if mirrored:
    xs = xp.flip(xs, axes[1])
  return xp.rot90(xs, quarter_turns, axes)


def image_back(xs, quarter_turns: int, mirrored: bool):
  """`image`'s inverse: an image of the turned tank seen as the original tank."""
  xp, axes = (np if isinstance(xs, np.ndarray) else jnp), _axes(xs)
  xs = xp.rot90(xs, -quarter_turns, axes)
  return xp.flip(xs, axes[1]) if mirrored else xs


def turn_conditions(
  cond: jax.Array, element: jax.Array, mean: np.ndarray, std: np.ndarray
) -> jax.Array:
  """EIM conditions (B, 16, 16, 1) of CDEIT's system, standardised with (mean, std), of the
  tanks turned by `GROUP[element]` (B,): the voltages read back, permuted, standardised again
  (exact: the statistics need not be symmetric)."""
  cdeit16 = layout_lib.preset("cdeit16")  # the EIM is of its 16 x 13 values (model.network)
  mean, std = (np.asarray(a, np.float32) for a in (mean, std))
  table = np.stack([permutation(q, m, cdeit16) for q, m in GROUP])
  v = measurement.voltages_from_eim(cond, mean, std, cdeit16)
  v = jnp.take_along_axis(v, jnp.asarray(table)[element], axis=-1)
  return measurement.condition(v, 1.0, mean, std, cdeit16)[0].astype(cond.dtype)


def turn_values(
  cond: jax.Array, element: jax.Array, mean: np.ndarray, std: np.ndarray, lay: layout_lib.Layout
) -> jax.Array:
  """Value conditions (B, R) of the device `lay` (a model that reads its values), standardised
  with (mean, std), of the tanks turned by `GROUP[element]` (B,): the values read back, turned
  (`turn`: permuted, signs applied), standardised again; NaN (a missing value) moves with its
  value."""
  mean, std = (np.ravel(np.asarray(a, np.float32)) for a in (mean, std))
  turns = [turn(q, m, lay) for q, m in GROUP]
  index = jnp.asarray(np.stack([i for i, _ in turns]))[element]  # (B, R)
  sign = jnp.asarray(np.stack([s for _, s in turns]))[element]
  v = cond.astype(jnp.float32) * std + mean
  v = jnp.take_along_axis(v, index, axis=-1) * sign
  return ((v - mean) / std).astype(cond.dtype)


def turn_back(images: jax.Array, element: jax.Array) -> jax.Array:
  """Images (B, H, W, C) sampled for the tanks of `turn_conditions`, each turned back."""
  every = jnp.stack([image_back(images, q, m) for q, m in GROUP])
  return every[element, jnp.arange(images.shape[0])]


class Augment:
  """grain random map: one of the eight symmetries per example (drawn from grain's per-index
  generator, so a resumed run draws the same), applied to the scaled voltages `ys` of the
  device `lay` and the `target`, and the condition recomputed from the
  turned voltages by the source (`source.condition`: the EIM, or any device's values)."""

  def __init__(self, source: Any, lay: layout_lib.Layout):
    self.source, self.layout = source, lay
    for q, m in GROUP:  # a device without these symmetries is refused before training
      turn(q, m, lay)

  def __call__(self, ex: dict, rng: np.random.Generator) -> dict:
    q, m = GROUP[int(rng.integers(len(GROUP)))]
    if (q, m) == (0, False):
      return ex
    index, sign = turn(q, m, self.layout)
    ys = ex["ys"][index] * sign
    src = self.source
    cond, v, scaled = src.condition(ys * np.float32(src.voltage_ratio))
    return {
      **ex,
      "cond": cond,
      "voltages": v,
      "ys": scaled,
      "target": np.ascontiguousarray(image(ex["target"], q, m)),
    }
