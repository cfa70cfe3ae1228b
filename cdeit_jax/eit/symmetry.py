"""The symmetries of a circular tank that map the pixel grid onto itself: training augmentation,
and symmetric sampling (each of a frame's samples sees the tank turned or mirrored another way).

With n electrodes evenly spaced (n divisible by 4), a quarter turn moves electrode e to e + n/4
and a mirror (x -> -x, the axis through electrode 0) moves e to -e; the 128 x 128 grid, centred
on the disk, maps onto itself under both. An example (voltages, image) turned or mirrored is an
exact example of the turned or mirrored tank, so the eight elements of the square's group make
eight examples of one simulation. The voltages are permuted (the signs cancel: a mirrored pair
reverses both the injection and the measurement), the image is turned with `np.rot90` (rows grow
with +y, docs/reference/eit-conventions.md, so a quarter turn of the array is a clockwise quarter
turn of the tank, the direction electrodes are numbered).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import measurement

GROUP = tuple((q, m) for m in (False, True) for q in range(4))  # (quarter turns, mirrored)


@functools.lru_cache(maxsize=64)
def permutation(
  quarter_turns: int, mirrored: bool, protocol: measurement.Protocol = measurement.DEFAULT
) -> np.ndarray:
  """Index p with `ys[..., p]` the voltages of the tank mirrored (first, if `mirrored`) and
  turned clockwise by `quarter_turns` quarter turns, for `ys` in the protocol's order."""
  n = protocol.num_electrodes
  if n % 4:
    raise InputError(
      f"protocol {protocol}: quarter turns need a number of electrodes divisible by 4"
    )
  shift, sign = quarter_turns * n // 4, -1 if mirrored else 1
  di, dm = protocol.injection_skip + 1, protocol.measurement_skip + 1

  def first(e: int, d: int) -> int:
    """The first electrode of the pair (e, e + d) after the map e -> sign * e + shift: a
    mirrored pair runs the other way round, so it starts at the image of e + d."""
    return (sign * (e if sign > 0 else e + d) + shift) % n

  where = {
    (k, m): i for i, (k, m) in enumerate((k, m) for k in range(n) for m in protocol.pairs[k])
  }
  p = np.empty(len(where), np.int32)
  for (k, m), i in where.items():
    p[where[first(k, di), first(m, dm)]] = i
  p.setflags(write=False)
  return p


def _axes(xs) -> tuple[int, int]:
  return (-3, -2) if xs.ndim >= 3 and xs.shape[-1] == 1 else (-2, -1)


def image(xs: np.ndarray, quarter_turns: int, mirrored: bool) -> np.ndarray:
  """`xs` (..., H, W[, 1]) (numpy or jax) as `permutation(quarter_turns, mirrored)` sees its
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
  cond: jax.Array,
  element: jax.Array,
  mean: np.ndarray,
  std: np.ndarray,
  protocol: measurement.Protocol = measurement.DEFAULT,
) -> jax.Array:
  """EIM conditions (B, n, n, 1), standardised with (mean, std), of the tanks turned by
  `GROUP[element]` (B,): the voltages read back, permuted, standardised again (exact: the
  statistics need not be symmetric)."""
  mean, std = (np.asarray(a, np.float32) for a in (mean, std))
  table = np.stack([permutation(q, m, protocol) for q, m in GROUP])
  v = measurement.voltages_from_eim(cond, mean, std, protocol)
  v = jnp.take_along_axis(v, jnp.asarray(table)[element], axis=-1)
  return measurement.condition(v, 1.0, mean, std, protocol)[0].astype(cond.dtype)


def turn_back(images: jax.Array, element: jax.Array) -> jax.Array:
  """Images (B, H, W, C) sampled for the tanks of `turn_conditions`, each turned back."""
  every = jnp.stack([image_back(images, q, m) for q, m in GROUP])
  return every[element, jnp.arange(images.shape[0])]


class Augment:
  """grain random map: one of the eight symmetries per example (drawn from grain's per-index
  generator, so a resumed run draws the same), applied to the scaled voltages `ys` and the
  `target`, and the conditioning recomputed from the turned voltages."""

  def __init__(self, source: Any):
    self.source = source

  def __call__(self, ex: dict, rng: np.random.Generator) -> dict:
    q, m = GROUP[int(rng.integers(len(GROUP)))]
    if (q, m) == (0, False):
      return ex
    ys = ex["ys"][permutation(q, m)]
    src = self.source
    cond, v, scaled = measurement.condition(
      ys * np.float32(src.voltage_ratio), src.voltage_ratio, src.mean, src.std
    )
    return {
      **ex,
      "cond": cond,
      "voltages": v,
      "ys": scaled,
      "target": np.ascontiguousarray(image(ex["target"], q, m)),
    }
