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


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The fit of one reference frame (module docstring)."""

  gain: float  # measured / simulated volts
  contact_impedance: float  # simulator units (z s / R)
  residual: float  # ||u - gain v|| / ||u|| over the present values
  values: int  # values fitted
  identifiable: bool  # whether z changes the residual by more than 1 % of itself in its range

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
    return np.asarray(jax.jit(cem.voltages)(jnp.ones(cem.num_elements, jnp.float64)))


def fit(layout: Layout, reference: np.ndarray, what: str = "the reference frame") -> Calibration:
  """Fit gain and contact impedance to `reference` (R,), NaN where a value is missing."""
  from scipy.optimize import minimize_scalar

  u = np.asarray(reference, np.float64).reshape(-1)
  present = layout.present(u)
  if present.sum() < 2:
    raise InputError(f"{what}: fewer than 2 finite values; give the empty tank's measurement")
  u = u[present]

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
  return Calibration(gain, 10.0**log10_z, residual, int(present.sum()), identifiable)
