"""Calibration of a measuring system from its reference (empty-tank) frame: what the simulator
must match to speak the device's units.

In 2-D the voltages of a homogeneous tank depend on the background conductivity s, the contact
impedance z and the tank radius R only through the gain 1/s and z s / R (docs/reference/
eit-conventions.md), so the reference frame fixes two numbers: the gain (measured / simulated
volts, the simulator at sigma = 1 and its nominal current) and the contact impedance in the
simulator's units. The gain is the least-squares fit in closed form for each z; z minimises the
remaining relative residual over the frame's present values, a bounded search over log10 z with
the simulator's own forward model (the same CEM that makes the training data). Where the
residual hardly changes with z (small z: the electrodes then short their boundary), z is not
identifiable and the fit says so.

A frame that cannot be the empty tank of this system is refused in one line (`check`): a gain
that is not positive (the frame's sign is flipped: a reversed measurement or current pattern),
a relative residual beyond `MAX_RESIDUAL` (not the empty tank's pattern: noise, a constant, a
target's frame, another device's), a gain beyond `GAIN_RANGE` (no unit of volts gives it), or
no non-zero value.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.fem import CEM
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import CURRENT
from cdeit_jax.eit.mesh import make_mesh, spec_for

LOG10_Z = (-4.0, 0.0)  # the contact impedances searched (simulator units; below 1e-4 the
# electrodes short their boundary already, and float32 solves lose digits)
# The largest relative residual of a reference frame accepted as the empty tank: real tanks fit
# to 0.014-0.098 (KTC2023's ref.mat 0.077; UEF2017's skip-2 tank 0.098 with too narrow
# electrodes, 0.014 with its own), damaged frames not below 0.99 (noise, a constant).
MAX_RESIDUAL = 0.3
# Measured / simulated volts of any real device: the simulator's volts at 1 mA and unit
# conductivity against a device's volts, millivolts or microvolts (KTC2023 1978, UEF2017 1041).
GAIN_RANGE = (1e-6, 1e12)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The fit of one reference frame (module docstring)."""

  gain: float  # measured / simulated volts
  contact_impedance: float  # simulator units (z s / R)
  residual: float  # ||u - gain v|| / ||u|| over the present values
  values: int  # values fitted
  identifiable: bool  # whether z changes the residual by more than 1 % of itself in its range

  def check(self, what: str) -> Calibration:
    """Itself, or an InputError naming `what` when the fit cannot be the empty tank's (module
    docstring)."""
    where = f"{what}: {self.describe()}"
    if not self.residual <= MAX_RESIDUAL:
      raise InputError(
        f"{where}: a residual beyond {MAX_RESIDUAL} means the frame is not the empty tank's "
        "pattern of this system (noise, a constant, a target's frame, or another device's); "
        "give the empty tank's frame"
      )
    if not (np.isfinite(self.gain) and self.gain > 0):
      raise InputError(
        f"{where}: the gain is not positive, so the frame's sign is flipped (a reversed "
        "measurement or current pattern, or a negated frame); give the empty tank's frame as "
        "the device measures it"
      )
    if not GAIN_RANGE[0] <= self.gain <= GAIN_RANGE[1]:
      raise InputError(
        f"{where}: outside {GAIN_RANGE[0]:g}..{GAIN_RANGE[1]:g} measured per simulated volt, "
        "which no unit of volts gives; give the frame in the device's volts"
      )
    return self

  def describe(self) -> str:
    z = f"{self.contact_impedance:.3g}" + ("" if self.identifiable else " (not identifiable)")
    return (
      f"gain {self.gain:.6g} (measured / simulated volts), contact impedance {z}, "
      f"relative residual {self.residual:.4f} over {self.values} values"
    )


def homogeneous(layout: Layout, contact_impedance: float, current: float = CURRENT) -> np.ndarray:
  """The simulator's homogeneous (sigma = 1) values (R,) of `layout`, in float64."""
  mesh = make_mesh(spec_for(layout))
  with jax.enable_x64(True):
    cem = CEM(mesh, contact_impedance, current, dtype=jnp.float64, layout=layout)
    return cem.host_voltages(np.ones(cem.num_elements))


def fit(layout: Layout, reference: np.ndarray, what: str = "the reference frame") -> Calibration:
  """Fit gain and contact impedance to `reference` (R,), NaN where a value is missing; a frame
  that cannot be this system's empty tank is an InputError naming `what` (`Calibration.check`)."""
  from scipy.optimize import minimize_scalar

  u = np.asarray(reference, np.float64).reshape(-1)
  present = layout.present(u)
  if np.isinf(u).any():
    raise InputError(
      f"{what}: infinite values at {np.flatnonzero(np.isinf(u))[:10].tolist()}; a missing "
      "value is NaN"
    )
  if present.sum() < 2:
    raise InputError(f"{what}: fewer than 2 finite values; give the empty tank's measurement")
  u = u[present]
  if not np.any(u != 0):
    raise InputError(f"{what}: every value is zero; give the empty tank's measurement")

  def gain_residual(log10_z: float) -> tuple[float, float]:
    v = homogeneous(layout, 10.0**log10_z)[present]
    g = float(v @ u / (v @ v))
    return g, float(np.linalg.norm(u - g * v) / np.linalg.norm(u))

  ends = [gain_residual(x)[1] for x in LOG10_Z]
  best = minimize_scalar(
    lambda x: gain_residual(x)[1], bounds=LOG10_Z, method="bounded", options={"xatol": 0.005}
  )
  log10_z = float(best.x) if best.fun <= min(ends) else LOG10_Z[int(np.argmin(ends))]
  gain, residual = gain_residual(log10_z)
  identifiable = max(ends) - residual > 0.01 * residual and min(ends) - residual > 0.01 * residual
  fit = Calibration(gain, 10.0**log10_z, residual, int(present.sum()), identifiable)
  return fit.check(what)
