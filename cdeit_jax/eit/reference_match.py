"""How frames compare with a reference frame (an empty tank's): the one computation behind the
checks that a reference is the model's or a translated run's empty tank, and that frames are
of the reference they are differenced with (`check_frames`): every entry point that takes
absolute frames and a reference (reconstruct, the Reconstructor, eval.py's recordings and
KTC2023's levels) passes it.

Thresholds, measured on real tanks (bench figures in docs/reconstructing.md): a frame of the same
tank, objects and all, keeps a cosine of at least 0.983 with its empty tank (UEF2017's 22
targets under skip-1 and skip-3: 0.989-1.000 and 0.983-1.000, 1-23 % apart; KTC2023's 28
targets of its 7 levels: 0.992-1.000, 3-13 % apart) at a scale (the coefficient along it) of
0.91-1.11; another protocol's frames on the same electrodes keep 0.48-0.51 (skip-3's frames
against skip-1's empty tank and back, 97-108 % apart), a reversed current's -1, and other units
are factors of 1000. SAME_TANK_COS = 0.9 lies 0.08 under the lowest real frame and 0.39 above
another protocol's; SCALE allows a device's drift and the training's gains (within 10 %) twice
over, and no change of units.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cdeit_jax.common.errors import InputError

SAME_TANK_COS = 0.9
SCALE = (0.5, 2.0)


@dataclasses.dataclass(frozen=True)
class Likeness:
  """Each frame against a reference, over the values finite in both: `cos` (N,) the cosine,
  `scale` (N,) the coefficient along the reference (1: the same size), `apart` (N,) the
  distance relative to the reference's norm; NaN where there is nothing to compare (fewer
  than 2 values, or a zero frame or reference)."""

  cos: np.ndarray
  scale: np.ndarray
  apart: np.ndarray


def likeness(frames: np.ndarray, reference: np.ndarray) -> Likeness:
  """`frames` (N, R) or (R,) against `reference` (R,) (`Likeness`)."""
  x = np.atleast_2d(np.asarray(frames, np.float64))
  r = np.broadcast_to(np.asarray(reference, np.float64).ravel()[None], x.shape)
  both = np.isfinite(x) & np.isfinite(r)
  x, r = np.where(both, x, 0.0), np.where(both, r, 0.0)
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    xr, rr = (x * r).sum(1), (r * r).sum(1)
    norms = np.sqrt((x * x).sum(1) * rr)
    some = (both.sum(1) >= 2) & (norms > 0) & np.isfinite(norms)
    cos = np.where(some, xr / np.where(some, norms, 1.0), np.nan)
    scale = np.where(some, xr / np.where(some, rr, 1.0), np.nan)
    apart = np.where(some, np.linalg.norm(x - r, axis=1) / np.sqrt(np.where(some, rr, 1.0)), np.nan)
  return Likeness(cos, scale, apart)


def check_frames(
  frames: np.ndarray,
  reference: np.ndarray,
  where: str,
  ref_where: str,
  fix: str,
  first_row: int = 0,
) -> None:
  """Absolute frames (N, R) that are not of the tank, protocol, sign and units of the reference
  (R,) they are differenced with are refused in one line naming their rows (counted from
  `first_row`), the likeness and `fix` (where the reference is given, in the command's words): the
  reference negated (another sign), another pattern (another protocol's, device's or tank's
  frames, or differences already) or another scale (other units). Rows with nothing to compare
  (all missing, or zero) are left to the frames' other guards."""
  s = likeness(frames, reference)
  one = np.ndim(frames) == 1  # one frame: no rows to name
  rows = lambda bad: "its frame" if one else f"rows {listed(first_row + np.flatnonzero(bad))}"
  are, differ, they = ("is", "differs", "it is") if one else ("are", "differ", "they are")
  negated = s.cos <= -SAME_TANK_COS
  if negated.any():
    raise InputError(
      f"{where}: {rows(negated)} {are} the reference frame ({ref_where}) negated (cosine "
      f"{np.nanmin(s.cos):.2f}): the frames and the reference were measured with opposite "
      f"signs; give frames and reference as one device measured them ({fix})"
    )
  other = s.cos < SAME_TANK_COS
  if other.any():
    worst = int(np.nanargmin(np.where(other, s.cos, np.nan)))
    small = abs(float(s.scale[worst])) < 0.1
    already = " (difference voltages already? then give no reference)" if small else ""
    raise InputError(
      f"{where}: {rows(other)} {differ} from the reference frame ({ref_where}) by "
      f"{s.apart[worst]:.0%} (cosine {s.cos[worst]:.2f}; a frame of the reference's tank, "
      f"objects and all, keeps {SAME_TANK_COS} or more): {they} not of its protocol, device "
      f"or tank{already}; give the frames with the reference frame they were measured with "
      f"({fix})"
    )
  off = (s.scale < SCALE[0]) | (s.scale > SCALE[1])
  if off.any():
    worst = int(np.nanargmax(np.where(off, np.abs(np.log(np.abs(s.scale))), np.nan)))
    raise InputError(
      f"{where}: {rows(off)} {are} {s.scale[worst]:.3g} times the reference frame "
      f"({ref_where}): other units, or another current; give frames and reference in one "
      f"device's units ({fix})"
    )


def listed(rows, most: int = 10) -> str:
  """Rows for a message: the first `most`, then how many more."""
  rows = [int(r) for r in rows]
  text = ", ".join(map(str, rows[:most]))
  return text + (f" and {len(rows) - most} more" if len(rows) > most else "")
