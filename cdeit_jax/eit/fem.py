"""Complete electrode model (CEM) on the disk mesh, in JAX: jit-able, vmap-able, differentiable.

Unknowns are the nodal potentials u (N) and the electrode potentials U (L), with the last
electrode's U = 0 as the ground (electrode differences do not depend on it). The system
(docs/reference/eit-conventions.md)

    [ A_M(sigma) + A_Z   A_W ] [u]   [0]
    [ A_W^T              A_D ] [U] = [I]

is symmetric positive definite once grounded. One dense Cholesky factorisation serves every
current pattern. The solve is a `lax.custom_linear_solve`, so gradients with respect to sigma
reuse the factorisation (one triangular solve per cotangent) instead of differentiating the
factorisation; this makes autodiff Jacobians cheap.

Dense rather than sparse: JAX has no portable sparse direct solver (jax.experimental.sparse's
spsolve is GPU-only), and for the ~2k unknowns of the default mesh a batched dense Cholesky is fast
on accelerators and acceptable on CPU.

One forward model for every measuring system (`eit.layout`; CDEIT's 16 electrodes by default) and
for the system fixed or drawn per call: `CEM.voltages(sigma)` solves the system it was built for,
condensed onto the nodes whose conductivity may vary; `CEM.voltages(sigma, system)` solves the
electrodes of a drawn system (`eit.system.draw`: positions, widths, contact impedances, passive
electrodes in the gaps), whose boundary nodes then stay unknowns (`_Drawn`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit.layout import CURRENT, Layout
from cdeit_jax.eit.mesh import DiskMesh


class Electrodes(Protocol):
  """What a drawn system gives the forward model (`eit.system.DrawnSystem` has it): the
  electrodes' polar angles, half-widths (radians) and weights 1 / z (0: absent), (electrodes,)."""

  centres: jax.Array
  half_widths: jax.Array
  weights: jax.Array


def boundary_geometry(mesh: DiskMesh) -> dict[str, np.ndarray]:
  """The boundary ring's edges (i, i+1): their node indices, start angle, angular span and
  length (float64)."""
  i = np.asarray(mesh.boundary)
  j = np.roll(i, -1)
  theta = np.arctan2(mesh.nodes[:, 1], mesh.nodes[:, 0])
  span = np.mod(theta[j] - theta[i], 2 * np.pi)
  h = np.linalg.norm(mesh.nodes[j] - mesh.nodes[i], axis=1)
  return {"i": i, "j": j, "theta": theta[i], "span": span, "h": h}


def electrode_terms(theta, span, h, centres, half_widths, weights, xp=np):
  """The CEM's electrode blocks for electrodes (L,) at polar angles `centres` (radians),
  `half_widths` wide on each side, each with weight 1 / z_l (0: absent), over boundary edges
  (Eb,) starting at angle `theta`, `span` radians long, `h` long:

    zz (Eb, 3): A_Z entries (i, i), (i, j), (j, j) of each edge;
    w (Eb, 2, L): -A_W, the coupling of the edge's nodes i and j to each electrode;
    d (L,): A_D's diagonal.

  An electrode may cover part of an edge: the integrals of the linear hat functions run over the
  covered part [t0, t1] of the edge (t along it, the angle taken linear in t), so that electrodes
  can sit anywhere on a fixed mesh; on edges an electrode covers whole, they are the usual
  h / (6 z) [[2, 1], [1, 2]], h / (2 z) and h / z. Written for numpy and jax.numpy alike (xp), so
  the fixed system (numpy, once) and a system drawn per example (on the devices) share it."""
  rel = xp.mod(theta[:, None] - centres[None, :] + np.pi, 2 * np.pi) - np.pi  # (Eb, L)
  t0 = xp.clip((-half_widths[None, :] - rel) / span[:, None], 0.0, 1.0)
  t1 = xp.clip((half_widths[None, :] - rel) / span[:, None], 0.0, 1.0)
  t1 = xp.maximum(t1, t0)
  d1, d2, d3 = t1 - t0, (t1**2 - t0**2) / 2, (t1**3 - t0**3) / 3
  wt = h[:, None] * weights[None, :]  # (Eb, L)
  ii = ((1 - t0) ** 3 - (1 - t1) ** 3) / 3
  zz = xp.stack([(wt * ii).sum(1), (wt * (d2 - d3)).sum(1), (wt * d3).sum(1)], 1)
  w = xp.stack([wt * (d1 - d2), wt * d2], 1)
  return zz, w, (wt * d1).sum(0)


def nominal_centres(lay: Layout, passive: bool = False) -> np.ndarray:
  """Polar angles of the layout's electrodes, and with `passive` one more in the middle of each
  gap, at E + l after electrode l (CDEIT's 16: electrode 0 at (0, 1), numbered clockwise)."""
  a = np.asarray(lay.angles, np.float64)
  if not passive:
    return a
  step = np.mod(np.roll(a, -1) - a + np.pi, 2 * np.pi) - np.pi  # to the next electrode
  return np.concatenate([a, a + step / 2])


def default_layout(mesh: DiskMesh) -> Layout:
  """CDEIT's 16 electrodes with the mesh's electrode width."""
  lay = layout_lib.preset("cdeit16")
  if mesh.spec.width_deg == 4.0:
    return lay
  return dataclasses.replace(lay, width=np.deg2rad(mesh.spec.width_deg))


def _checked_dtype(dtype) -> jnp.dtype:
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float64 and not jax.config.jax_enable_x64:
    raise InputError(
      "dtype float64 needs 64-bit JAX: run under `with jax.enable_x64(True):` "
      "or set JAX_ENABLE_X64=1"
    )
  return dtype


def element_stiffness(mesh: DiskMesh) -> np.ndarray:
  """(E, 3, 3) element stiffness matrices for sigma = 1: (b b^T + c c^T) / (4 |T|)."""
  p = mesh.nodes[mesh.triangles]
  b = np.stack([p[:, 1, 1] - p[:, 2, 1], p[:, 2, 1] - p[:, 0, 1], p[:, 0, 1] - p[:, 1, 1]], 1)
  c = np.stack([p[:, 2, 0] - p[:, 1, 0], p[:, 0, 0] - p[:, 2, 0], p[:, 1, 0] - p[:, 0, 0]], 1)
  return (b[:, :, None] * b[:, None, :] + c[:, :, None] * c[:, None, :]) / (
    4 * mesh.areas()[:, None, None]
  )


def _support_mask(mesh: DiskMesh, support: np.ndarray | None) -> np.ndarray:
  var = np.ones(mesh.num_elements, bool) if support is None else np.asarray(support, bool)
  if var.shape != (mesh.num_elements,) or not var.any():
    raise InputError(
      f"support must be a non-empty boolean mask of the {mesh.num_elements} elements"
    )
  return var


def _spd_solve(matrix: Callable[[], jax.Array], rhs: jax.Array) -> jax.Array:
  """matrix()^-1 rhs by one Cholesky factorisation, as a `custom_linear_solve`: gradients with
  respect to what `matrix` depends on reuse the factorisation."""
  factor = jax.lax.stop_gradient(jnp.linalg.cholesky(matrix()))
  solve = lambda _, b: jax.scipy.linalg.cho_solve((factor, True), b)
  return jax.lax.custom_linear_solve(lambda v: matrix() @ v, rhs, solve=solve, symmetric=True)


class CEM:
  """Forward model of one mesh and measuring system (`layout`, `cdeit_jax.eit.layout`: its
  electrodes, patterns and contact impedance; CDEIT's 16 electrodes by default): element
  conductivities (..., E) -> the system's values (..., R).

  Everything that does not depend on sigma is precomputed in float64 numpy at construction and
  condensed away: the electrode potentials (and, with `support`, every node outside the elements
  whose conductivity may vary) are eliminated by a constant Schur complement, so each sample
  factorises only the |V| x |V| system of the nodes that can see a change. With `support`,
  elements outside it are taken to have conductivity `sigma_bg` whatever `sigma` says there.
  """

  def __init__(
    self,
    mesh: DiskMesh,
    contact_impedance: float | np.ndarray | None = None,
    current: float = CURRENT,
    dtype=jnp.float32,
    support: np.ndarray | None = None,
    sigma_bg: float = 1.0,
    *,
    layout: Layout,
  ):
    """`layout`: the measuring system on `mesh` (`default_layout(mesh)`: CDEIT's);
    `contact_impedance`: one value or one per electrode in place of the layout's (`z`)."""
    self.mesh = mesh
    self.dtype = _checked_dtype(dtype)
    self.layout = layout
    self.current, self.sigma_bg, self.support = float(current), float(sigma_bg), support
    ne = layout.num_electrodes
    if contact_impedance is None:
      contact_impedance = layout.z
    z = np.broadcast_to(np.asarray(contact_impedance, np.float64), (ne,))
    if np.any(z <= 0):
      raise InputError(f"contact_impedance must be > 0, got {contact_impedance}")
    n = mesh.num_nodes
    size = n + ne - 1  # grounded: the last electrode's U = 0 is dropped
    ke = element_stiffness(mesh)
    full = np.zeros((n + ne, n + ne))
    g = boundary_geometry(mesh)
    zz, w, d = electrode_terms(
      g["theta"],
      g["span"],
      g["h"],
      layout.angles,
      np.full(ne, layout.width / 2),
      1 / z,
    )
    for (a, b), col in (
      ((g["i"], g["i"]), 0),
      ((g["i"], g["j"]), 1),
      ((g["j"], g["i"]), 1),
      ((g["j"], g["j"]), 2),
    ):
      np.add.at(full, (a, b), zz[:, col])
    for k, nodes in ((0, g["i"]), (1, g["j"])):
      np.add.at(full, (nodes[:, None], n + np.arange(ne)[None, :]), -w[:, k])
      np.add.at(full, (n + np.arange(ne)[None, :], nodes[:, None]), -w[:, k])
    full[n + np.arange(ne), n + np.arange(ne)] += d
    full = full[:size, :size]
    var = _support_mask(mesh, support)
    tri = mesh.triangles
    fixed = np.flatnonzero(~var)
    np.add.at(full, (tri[fixed][:, :, None], tri[fixed][:, None, :]), sigma_bg * ke[fixed])
    v_nodes = np.unique(tri[var])
    f_idx = np.setdiff1d(np.arange(size), v_nodes)
    # Schur complement onto V (constant part) and the maps back to electrode potentials
    a_ff, a_vf = full[np.ix_(f_idx, f_idx)], full[np.ix_(v_nodes, f_idx)]
    currents = layout.currents * current
    rhs = np.zeros((size, currents.shape[1]))
    rhs[n:] = currents[: ne - 1]  # column k: injection k
    inv_ff_fv = np.linalg.solve(a_ff, a_vf.T)  # (F, V)
    inv_ff_bf = np.linalg.solve(a_ff, rhs[f_idx])  # (F, patterns)
    schur = full[np.ix_(v_nodes, v_nodes)] - a_vf @ inv_ff_fv
    elec = np.searchsorted(f_idx, np.arange(n, size))  # electrode rows within F
    self._schur = jnp.asarray(schur, self.dtype)
    self._rhs = jnp.asarray(-a_vf @ inv_ff_bf, self.dtype)  # (V, 16)
    self._elec_t = jnp.asarray(inv_ff_fv[elec], self.dtype)  # (15, V)
    self._elec_c = jnp.asarray(inv_ff_bf[elec], self.dtype)  # (15, 16)
    local = np.full(n, -1)
    local[v_nodes] = np.arange(len(v_nodes))
    vt = local[tri[var]]  # (E_var, 3) local indices
    self._var = jnp.asarray(np.flatnonzero(var), jnp.int32)
    self._ke = jnp.asarray(ke[var], self.dtype)
    self._rows = jnp.asarray(np.repeat(vt, 3, axis=1).reshape(-1), jnp.int32)
    self._cols = jnp.asarray(np.tile(vt, (1, 3)).reshape(-1), jnp.int32)
    self._measure = layout.measure
    self.num_electrodes = ne
    self.num_unknowns = len(v_nodes)
    self._drawn: dict[bool, _Drawn] = {}

  @property
  def num_elements(self) -> int:
    return self.mesh.num_elements

  def system_matrix(self, sigma: jax.Array) -> jax.Array:
    """The condensed SPD matrix (V, V) for element conductivities sigma (E,)."""
    vals = (sigma[self._var, None, None] * self._ke).reshape(-1)
    return self._schur.at[self._rows, self._cols].add(vals)

  def electrode_potentials(self, sigma: jax.Array) -> jax.Array:
    """(electrodes, patterns) potentials for sigma (E,), the last electrode grounded."""
    sigma = jnp.asarray(sigma, self.dtype)
    x = _spd_solve(lambda: self.system_matrix(sigma), self._rhs)
    u = self._elec_c - self._elec_t @ x
    return jnp.concatenate([u, jnp.zeros((1, u.shape[1]), u.dtype)], 0)

  def voltages(self, sigma: jax.Array, system: Electrodes | None = None) -> jax.Array:
    """The measurements for element conductivities sigma (..., E), the `layout`'s values in its
    order and sign (CDEIT's 208 by default): of the system this CEM was built for, or of one
    drawn system (`eit.system.DrawnSystem`, or any value with its `centres`, `half_widths` and
    `weights` (electrodes,): the layout's electrodes then, with more, the passive ones; sigma
    (E,)). A drawn system's gain is the caller's to apply (`eit.simulator`)."""
    sigma = jnp.asarray(sigma, self.dtype)
    if system is not None:
      passive = system.centres.shape[-1] > self.num_electrodes
      return self._measure(self.drawn(passive).electrode_potentials(sigma, system))
    if sigma.ndim > 1:
      flat = sigma.reshape(-1, sigma.shape[-1])
      return jax.vmap(self.voltages)(flat).reshape(*sigma.shape[:-1], -1)
    return self._measure(self.electrode_potentials(sigma))

  def drawn(self, passive: bool = False) -> _Drawn:
    """The operators of drawn systems (with `passive`: one passive electrode in each gap), made
    once; build them outside a trace (constants made inside one would belong to it)."""
    if passive not in self._drawn:
      self._drawn[passive] = _Drawn(self, passive)
    return self._drawn[passive]


class _Drawn:
  """The operators of a CEM's drawn systems: the electrode blocks change per call, so the
  boundary nodes stay unknowns; every other node outside the elements whose conductivity may
  vary (the CEM's `support`) is condensed away once. The layout's last electrode is the ground;
  electrodes E..2E-1 (with `passive`) are the passive ones, which carry no current."""

  def __init__(self, cem: CEM, passive: bool):
    mesh, lay = cem.mesh, cem.layout
    self.dtype = cem.dtype
    e = lay.num_electrodes
    self.num_electrodes = ne = 2 * e if passive else e
    n, tri = mesh.num_nodes, mesh.triangles
    ke = element_stiffness(mesh)
    var = _support_mask(mesh, cem.support)
    g = boundary_geometry(mesh)
    keep = np.union1d(np.unique(tri[var]), g["i"])
    drop = np.setdiff1d(np.arange(n), keep)
    a = np.zeros((n, n))
    fixed = np.flatnonzero(~var)
    np.add.at(a, (tri[fixed][:, :, None], tri[fixed][:, None, :]), cem.sigma_bg * ke[fixed])
    schur = a[np.ix_(keep, keep)]
    if len(drop):
      schur = schur - a[np.ix_(keep, drop)] @ np.linalg.solve(
        a[np.ix_(drop, drop)], a[np.ix_(drop, keep)]
      )
    nv = len(keep)
    size = nv + ne - 1
    const = np.zeros((size, size))
    const[:nv, :nv] = schur
    local = np.full(n, -1)
    local[keep] = np.arange(nv)
    vt = local[tri[var]]
    # electrode l's row; the ground (e - 1) gets `size`, out of bounds: scatters drop it
    erow = np.array(
      [nv + l if l < e - 1 else (size if l == e - 1 else nv + l - 1) for l in range(ne)]
    )
    rhs = np.zeros((size, lay.num_patterns))
    rhs[erow[: e - 1]] = (lay.currents * cem.current)[: e - 1]
    f = lambda x: jnp.asarray(x, self.dtype)
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    self._const, self._rhs, self._ke = f(const), f(rhs), f(ke[var])
    self._var = i32(np.flatnonzero(var))
    self._rows = i32(np.repeat(vt, 3, axis=1).reshape(-1))
    self._cols = i32(np.tile(vt, (1, 3)).reshape(-1))
    self._theta, self._span, self._h = f(g["theta"]), f(g["span"]), f(g["h"])
    self._bi, self._bj, self._erow = i32(local[g["i"]]), i32(local[g["j"]]), i32(erow)
    self._ground = e - 1
    self.num_unknowns = size

  def system_matrix(self, sigma: jax.Array, system: Electrodes) -> jax.Array:
    """The SPD matrix (unknowns, unknowns) for element conductivities sigma (E,) and one
    system's electrodes (`centres`, `half_widths`, `weights` (electrodes,))."""
    f = lambda a: jnp.asarray(a, self.dtype)
    weights = f(system.weights)
    zz, w, d = electrode_terms(
      self._theta, self._span, self._h, f(system.centres), f(system.half_widths), weights, jnp
    )
    bi, bj, er = self._bi, self._bj, self._erow
    m = self._const.at[self._rows, self._cols].add(
      (sigma[self._var, None, None] * self._ke).reshape(-1)
    )
    m = m.at[jnp.concatenate([bi, bi, bj, bj]), jnp.concatenate([bi, bj, bi, bj])].add(
      jnp.concatenate([zz[:, 0], zz[:, 1], zz[:, 1], zz[:, 2]])
    )
    for k, nodes in ((0, bi), (1, bj)):
      rows = jnp.broadcast_to(nodes[:, None], w[:, k].shape)
      cols = jnp.broadcast_to(er[None, :], w[:, k].shape)
      m = m.at[rows, cols].add(-w[:, k], mode="drop").at[cols, rows].add(-w[:, k], mode="drop")
    # an absent electrode (weight 0) gets a 1 on its diagonal: U = 0, coupled to nothing
    return m.at[er, er].add(d + (weights == 0), mode="drop")

  def electrode_potentials(self, sigma: jax.Array, system: Electrodes) -> jax.Array:
    """(the layout's electrodes, patterns) potentials for sigma (E,) seen by one system."""
    x = _spd_solve(lambda: self.system_matrix(sigma, system), self._rhs)
    e = self._ground + 1
    return jnp.concatenate([x[self._erow[: e - 1]], jnp.zeros((1, x.shape[1]), x.dtype)], 0)
