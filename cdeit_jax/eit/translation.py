"""A device's difference values translated into another measuring system's on the same electrodes
(docs/your_device.md): another protocol's frames for a model trained on CDEIT's 16 electrodes.

Every value of a 2-D EIT device is `a^T R c`: the measured pair `a` (+1, -1), the pattern's
currents `c` and the tank's transfer matrix `R` (electrode potentials per electrode current), which
is symmetric (reciprocity) and the same whatever the protocol, for the full nonlinear problem, not
its linearisation. With the potentials and currents written on the differences `e_k - e_0`, `R` is
a symmetric (E-1) x (E-1) matrix, and each value is a fixed linear function of it (`design`). A
frame of any protocol on the same electrodes therefore determines the part of `R` its patterns
reach, and with it that part of any other protocol's values. What it does not reach (for 16
electrodes: one number for skip-1 currents, six for skip-3) is estimated from the rest by the
Gaussian conditional mean under a prior on the difference of `R`, `J J^T`, with `J` the
linearised transfer matrix's Jacobian on the 128 x 128 label grid at the device's calibrated
width and contact impedance (`eit.tikhonov.layout_jacobian`), and noise at `NOISE_DB` below the
prior's signal, the noise the simulator trains models with:

  t = A_t C A_d^T (A_d C A_d^T + s I)^-1 d,  C = J J^T,  s = 10^(-NOISE_DB/10) tr(A_d C A_d^T) / R_d

On UEF2017's tank the skip-1 and skip-3 frames of its 22 targets, translated so into the
adjacent protocol, are within 7 % (median, relative) of the same targets' adjacent frames, which
the tank measured separately. A frame's missing values (NaN) are left out of `d` and `A_d`: the
rest determine what they can (`matrix` of each missing set, computed once).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.layout import Layout, spacing

NOISE_DB = 40.0  # the simulator's training noise (configs/demo.py: 40 +- 5 dB)
MATCH = 0.1  # electrodes are the same when their centres are within this share of the spacing


def electrode_order(device: Layout, target: Layout) -> np.ndarray | None:
  """For each of `target`'s electrodes, the `device` electrode at the same place (centres within
  `MATCH` of the spacing), or None when the two have not the same electrodes."""
  if device.num_electrodes != target.num_electrodes:
    return None
  gap = np.angle(np.exp(1j * (target.angles[:, None] - device.angles[None, :])))
  order = np.argmin(np.abs(gap), axis=1)
  close = np.abs(gap[np.arange(len(order)), order]) <= MATCH * spacing(device.angles)
  if not close.all() or len(set(order.tolist())) != len(order):
    return None
  return order


def design(lay: Layout, order: np.ndarray | None = None) -> np.ndarray:
  """(values, (E-1)^2): each value of `lay` as a linear function of the transfer matrix on the
  differences e_k - e_0 (k = 1 .. E-1) of the device's electrodes; `order`: for each of `lay`'s
  electrodes, the device's (`electrode_order`), by default the same numbers."""
  e = lay.num_electrodes
  order = np.arange(e) if order is None else np.asarray(order)
  r = np.arange(lay.num_values)
  c = np.zeros((lay.num_values, e))
  c[:, order] = lay.currents[:, lay.rows[:, 0]].T
  a = np.zeros((lay.num_values, e))
  a[r, order[lay.rows[:, 1]]] += 1.0
  a[r, order[lay.rows[:, 2]]] -= 1.0
  # a zero-sum vector is sum_k v_k (e_k - e_0), k >= 1: its coordinates are v[1:]
  return np.einsum("rj,rk->rjk", a[:, 1:], c[:, 1:]).reshape(lay.num_values, -1)


def transfer_layout(device: Layout) -> Layout:
  """The device's electrodes driven and read against electrode 0: current into k and out of 0,
  the potential of j against 0 (j, k = 1 .. E-1), whose (E-1)^2 values are the transfer matrix."""
  e = device.num_electrodes
  cur = np.zeros((e, e - 1))
  cur[np.arange(1, e), np.arange(e - 1)] = 1.0
  cur[0] = -1.0
  rows = np.array([(p, j, 0) for p in range(e - 1) for j in range(1, e)], np.int32)
  return Layout("transfer", device.angles, device.width, cur, rows, contact_impedance=device.z)


@dataclasses.dataclass(frozen=True, eq=False)
class Translator:
  """`device`'s difference values (simulation units: measured / its gain) -> `target`'s on the
  same electrodes (module docstring). `prior` ((E-1)^2 square): the transfer matrix's prior
  covariance."""

  device: Layout
  target: Layout
  prior: np.ndarray
  noise_db: float = NOISE_DB

  @classmethod
  def between(cls, device: Layout, target: Layout, noise_db: float = NOISE_DB) -> Translator:
    """The translator, its prior from the device's Jacobian; an InputError when the two do not
    have the same electrodes."""
    from cdeit_jax.eit import tikhonov

    if electrode_order(device, target) is None:
      raise InputError(
        f"{device.describe()} has not the electrodes of {target.describe()} (the same count, "
        f"centres within {MATCH:.0%} of the spacing): its values cannot be translated"
      )
    jac = tikhonov.layout_jacobian(transfer_layout(device))
    jac = jac.reshape(len(jac), -1)
    jac = jac[:, np.abs(jac).sum(0) > 0]
    return cls(device, target, jac @ jac.T, noise_db)

  @functools.cached_property
  def _designs(self) -> tuple[np.ndarray, np.ndarray]:
    order = electrode_order(self.device, self.target)
    return design(self.device), design(self.target, order)

  @functools.lru_cache(maxsize=16)  # noqa: B019 (one translator per run; a few missing sets)
  def _matrix(self, present: bytes) -> np.ndarray:
    keep = np.frombuffer(present, bool)
    a_d, a_t = self._designs
    a_d = a_d[keep]
    k = a_d @ self.prior @ a_d.T
    k[np.diag_indices_from(k)] += 10 ** (-self.noise_db / 10) * np.trace(k) / len(k)
    return np.linalg.solve(k, a_d @ self.prior @ a_t.T).T  # (R_t, R_d present)

  def matrix(self, present: np.ndarray | None = None) -> np.ndarray:
    """(target values, device values present) float64: the translation of frames that hold
    the values `present` (R_d,) bool (default: all)."""
    if present is None:
      present = np.ones(self.device.num_values, bool)
    return self._matrix(np.ascontiguousarray(present, bool).tobytes())

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """(N, R_t) float32 of device values (N, R_d) in simulation units, NaN where missing; a
    frame missing every value gives NaN."""
    v = np.asarray(values, np.float64)
    out = np.full((len(v), self.target.num_values), np.nan)
    present = np.isfinite(v)
    for mask in np.unique(present, axis=0):
      rows = np.all(present == mask, axis=1)
      if mask.any():
        out[rows] = v[rows][:, mask] @ self.matrix(mask).T
    return out.astype(np.float32)

  def determined_values(self, present: np.ndarray | None = None) -> np.ndarray:
    """(R_t,): the share of each target value's prior variance that frames holding the values
    `present` (R_d,) bool (default: all) determine (1: it follows from them)."""
    if present is None:
      present = np.ones(self.device.num_values, bool)
    present = np.asarray(present, bool)
    explained, prior = self._explained(present)
    return explained / prior

  def _explained(self, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R_t,) twice: each target value's prior variance explained by the values `present`,
    and its prior variance."""
    a_d, a_t = self._designs
    t = self.matrix(present)
    prior = np.einsum("ij,jk,ik->i", a_t, self.prior, a_t)
    explained = np.einsum("ij,ji->i", t, a_d[present] @ self.prior @ a_t.T)
    return explained, prior

  def determined(self) -> float:
    """The share of the target values' prior variance that the device's values determine
    (1: every target value follows from the device's; under the prior and noise above)."""
    explained, prior = self._explained(np.ones(self.device.num_values, bool))
    return float(explained.sum() / prior.sum())
