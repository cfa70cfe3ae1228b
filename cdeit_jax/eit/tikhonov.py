"""One-step regularised difference reconstruction (Tikhonov / NOSER) on the 128 x 128 grid.

    x = (J^T J + lambda W)^(-1) J^T ys = W^-1 J^T (J W^-1 J^T + lambda I)^(-1) ys

J (R values, pixels in the disk) is the Jacobian of the simulator of a measuring system
(CDEIT's 208 values by default) at the homogeneous background with respect to the label image
xs (sigma = 10^xs); W = diag(J^T J)^p (p = 1: NOSER, Cheney et al. 1990; p = 0: plain Tikhonov)
and lambda = alpha * trace(J W^-1 J^T) / R. The right side is the R x R form, so the
reconstruction matrix (pixels x R) is built once and applied to any measurement as one matrix
product. Outputs are in label units, zero outside the disk.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import fem, layout, mesh, simulator
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.mesh import MeshSpec
from cdeit_jax.eit.simulator import Simulator

DEFAULT_ALPHA = 0.1  # with noser_exponent 0.5: best RMSE on 128 simulated validation phantoms
NOSER_EXPONENT = 0.5
log = logging.getLogger("cdeit_jax.eit")


def jacobian(sim: Simulator) -> np.ndarray:
  """(values, 128, 128) d ys / d xs at xs = 0 (208 values for CDEIT's system, the layout's for
  another), by the adjoint method on the host in float64 (KTC2023's 2,356 rows in about a
  second, memory growing with the rows; autodiff's batched pull-back asked for one unknowns x
  unknowns matrix per row). With the homogeneous system matrix M (one Cholesky factorisation),
  the fields X of the current patterns and, by reciprocity, the fields Y of a unit current
  through each measured pair (m: +1 at electrode +, -1 at electrode -), value r's sensitivity to
  element e is y_r[e]^T K_e x_p[e] (K_e its stiffness; the electrode potentials are a linear map
  of the nodes, so d U = E M^-1 dM X). The partial-volume map (a triangle's conductivity is the
  mean of 10^x over its sample points' pixels) takes it to the pixels. Checked against autodiff
  through the CEM (tests/test_fem.py)."""
  import scipy.linalg
  import scipy.sparse

  lay = sim.layout
  with jax.enable_x64(True):
    cem = fem.CEM(sim.mesh, dtype=jnp.float64, layout=lay, sigma_bg=sim.sigma_bg)
    m = np.asarray(cem.system_matrix(jnp.full(sim.mesh.num_elements, sim.sigma_bg)))
    ops = {k: np.asarray(getattr(cem, k)) for k in ("_rhs", "_elec_t", "_ke", "_var", "_rows")}
  factor = scipy.linalg.cho_factor(m)
  x = scipy.linalg.cho_solve(factor, ops["_rhs"])  # (V, P): the patterns' fields
  pairs, pair_of = np.unique(lay.rows[:, 1:], axis=0, return_inverse=True)
  ne, q = cem.num_electrodes, np.arange(len(pairs))
  unit = np.zeros((ne, len(pairs)))
  unit[pairs[:, 0], q] += 1.0
  unit[pairs[:, 1], q] -= 1.0
  y = scipy.linalg.cho_solve(factor, ops["_elec_t"].T @ unit[: ne - 1])  # (V, Q); ground dropped
  nodes = ops["_rows"].reshape(-1, 9)[:, ::3]  # (E_var, 3): each element's local nodes
  kx = np.einsum("eij,ejp->eip", ops["_ke"], x[nodes])
  per_element = np.einsum("eiq,eip->eqp", y[nodes], kx)  # (E_var, pairs, patterns)
  by_element = per_element[:, pair_of.reshape(-1), lay.rows[:, 0]]  # (E_var, R)
  pix = np.asarray(sim.pixel_index)[ops["_var"]]  # (E_var, S)
  e, samples = pix.shape
  pull = scipy.sparse.csr_matrix(
    (
      np.full(e * samples, sim.sigma_bg * np.log(10.0) / samples),
      (pix.reshape(-1), np.repeat(np.arange(e), samples)),
    ),
    shape=(ph.IMAGE_SIZE**2, e),
  )
  jac = np.asarray(pull @ by_element).T  # (R, pixels)
  dtype = np.float32 if sim.dtype == jnp.float32 else np.float64
  return jac.reshape(len(lay.rows), ph.IMAGE_SIZE, ph.IMAGE_SIZE).astype(dtype)


def layout_jacobian(lay: layout.Layout) -> np.ndarray:
  """`jacobian` (values, 128, 128) of a measuring system (`eit.layout.Layout`: its electrodes,
  patterns and contact impedance) on a mesh made for its electrodes, computed once per process
  and system and shared by the Tikhonov baseline and the physics-informed conditioning (systems
  that measure alike share it: `Layout.physics`); kept on disk beside the compilation cache when
  a command enabled one (`compile_cache.folder()`), under a name that hashes the system and the
  simulator's source, so no other code's Jacobian is ever read."""
  return _layout_jacobian(lay.physics)


@functools.lru_cache(maxsize=2)  # one or two systems in a process: 150 MB each for KTC2023
def _layout_jacobian(physics: layout.Layout) -> np.ndarray:
  return _stored(physics, lambda: jacobian(simulator.default_simulator(layout=physics)))


def _stored(physics: layout.Layout, compute) -> np.ndarray:
  path = _jacobian_file(physics)
  if path is not None:
    try:
      return fileio.load_numpy(path)
    except (OSError, ValueError):  # absent or unreadable: computed (and written) again
      pass
  with jax.ensure_compile_time_eval():  # concrete also when first asked under a trace
    jac = compute()
  if path is not None:

    def save(p):
      with open(p, "wb") as fh:  # a handle: np.save would append ".npy" to the temporary name
        np.save(fh, jac)

    try:
      fileio.makedirs(fileio.dirname(path))
      fileio.atomic_write(path, save)
    except OSError as e:  # a cache that cannot be written costs time, nothing else
      log.warning("could not keep the Jacobian in %s (%s)", path, e)
  return jac


def _jacobian_file(physics: layout.Layout) -> str | None:
  from cdeit_jax.common import compile_cache

  folder = compile_cache.folder()
  if folder is None:
    return None
  h = hashlib.sha256(repr((physics.z, dataclasses.astuple(MeshSpec()))).encode())
  h.update(physics.signature.encode() + physics.currents.tobytes())
  for module in (fem, mesh, simulator, ph, layout, sys.modules[__name__]):  # the code behind it
    h.update(pathlib.Path(module.__file__).read_bytes())
  return fileio.join(folder, "derived", f"jacobian-{h.hexdigest()[:20]}.npy")


def weighted_system(jac: np.ndarray, noser_exponent: float = NOSER_EXPONENT):
  """(disk, J restricted to the disk (R, pixels), W^-1 (pixels,), J W^-1 J^T (R, R)) in
  float64 for a Jacobian (R, N, N) (N = 128, or a coarser grid), W = diag(J^T J)^noser_exponent."""
  j = np.asarray(jac).reshape(len(jac), -1).astype(np.float64)
  disk = ph.disk_mask(jac.shape[-1]).reshape(-1)
  jd = j[:, disk]
  w_inv = 1.0 / np.maximum((jd * jd).sum(0), 1e-300) ** noser_exponent
  return disk, jd, w_inv, (jd * w_inv) @ jd.T


class Tikhonov:
  """Reconstruction matrix of one Jacobian `jac` (R, 128, 128) of a measuring system
  (`layout_jacobian`, or `jacobian(sim)` on a simulator's own mesh); call it on ys (..., R) in
  simulation units (any system's present values with the Jacobian's rows for them: missing
  values are left out, not zero-filled)."""

  def __init__(
    self,
    jac: np.ndarray,
    alpha: float = DEFAULT_ALPHA,
    noser_exponent: float = NOSER_EXPONENT,
  ):
    if not (np.isfinite(alpha) and alpha > 0):
      raise InputError(f"alpha must be a finite number > 0, got {alpha}")
    self.disk, jd, w_inv, gram = weighted_system(jac, noser_exponent)
    lam = alpha * np.trace(gram) / len(gram)
    self.matrix = (w_inv[:, None] * jd.T) @ np.linalg.inv(gram + lam * np.eye(len(gram)))
    self.alpha, self.noser_exponent = alpha, noser_exponent

  def __call__(self, ys) -> np.ndarray:
    """Images (..., 128, 128) (the Jacobian's grid) from difference voltages (..., R) or
    (..., R, 1)."""
    ys = np.asarray(ys, np.float64)
    r = self.matrix.shape[1]
    if ys.shape[-1] == 1 and ys.ndim >= 2 and ys.shape[-2] == r:
      ys = ys[..., 0]
    if ys.shape[-1] != r:
      raise InputError(f"expected {r} voltages in the last axis, got shape {ys.shape}")
    out = np.zeros(ys.shape[:-1] + (self.disk.size,), np.float32)
    out[..., self.disk] = ys @ self.matrix.T
    side = int(round(np.sqrt(self.disk.size)))  # 128, or the Jacobian's coarser grid
    return out.reshape(ys.shape[:-1] + (side, side))


_of_values: dict = {}


def of_values(
  lay: layout.Layout,
  present: np.ndarray | None = None,
  alpha: float = DEFAULT_ALPHA,
):
  """The one Tikhonov/NOSER reconstruction of a measuring system (its contact impedance
  included) from the values `present` (R,) bool (default: all), a function of difference
  values (..., R) in simulation units whose other values are left out, not zero-filled: the
  same matrix for the simulated files' `TR`, the evaluation's baseline and the challenge's
  linearised answers. Matrices are kept for the last eight (system, values) pairs (one per
  removal pattern of a device)."""
  keep = np.ones(lay.num_values, bool) if present is None else np.asarray(present, bool)
  key = (lay.physics, float(alpha), keep.tobytes())
  if key not in _of_values:
    while len(_of_values) >= 8:
      _of_values.pop(next(iter(_of_values)))
    matrix = Tikhonov(jac=layout_jacobian(lay)[keep], alpha=alpha)
    _of_values[key] = lambda ys: matrix(np.asarray(ys)[..., keep])
  return _of_values[key]


def default_tikhonov(lay: layout.Layout, alpha: float = DEFAULT_ALPHA) -> Tikhonov:
  """The Tikhonov/NOSER reconstruction of the measuring system `lay` from all its values."""
  return _tikhonov(lay.physics, float(alpha))


@functools.lru_cache(maxsize=4)
def _tikhonov(physics: layout.Layout, alpha: float) -> Tikhonov:
  return Tikhonov(alpha=alpha, jac=layout_jacobian(physics))
