"""Complete electrode model (CEM) on the disk mesh, in JAX: jit-able, vmap-able, differentiable.

Unknowns are the nodal potentials u (N) and the electrode potentials U (16), with U_15 = 0 as the
ground (electrode differences do not depend on it). The system (reference: eit-conventions.md)

    [ A_M(sigma) + A_Z   A_W ] [u]   [0]
    [ A_W^T              A_D ] [U] = [I]

is symmetric positive definite once grounded. One dense Cholesky factorisation serves the 16
injections. The solve is a `lax.custom_linear_solve`, so gradients with respect to sigma reuse the
factorisation (one triangular solve per cotangent) instead of differentiating the factorisation;
this makes autodiff Jacobians cheap.

Dense rather than sparse: JAX has no portable sparse direct solver (jax.experimental.sparse's
spsolve is GPU-only), and for the ~2k unknowns of the default mesh a batched dense Cholesky is fast
on accelerators and acceptable on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.eit.mesh import NUM_ELECTRODES, DiskMesh, MeshSpec, make_mesh
from cdeit_jax.errors import InputError
from cdeit_jax.measurement import CONTACT_IMPEDANCE, CURRENT, DEFAULT as PROTOCOL


class CEM:
  """Forward model of one mesh: element conductivities (..., E) -> 208 voltages (..., 208).

  Everything that does not depend on sigma is precomputed in float64 numpy at construction and
  condensed away: the electrode potentials (and, with `support`, every node outside the elements
  whose conductivity may vary) are eliminated by a constant Schur complement, so each sample
  factorises only the |V| x |V| system of the nodes that can see a change. With `support`,
  elements outside it are taken to have conductivity `sigma_bg` whatever `sigma` says there.
  """

  def __init__(self, mesh: DiskMesh | None = None,
               contact_impedance: float = CONTACT_IMPEDANCE, current: float = CURRENT, dtype=jnp.float32, support: np.ndarray | None = None,
               sigma_bg: float = 1.0):
    self.mesh = mesh = mesh if mesh is not None else make_mesh(MeshSpec())
    self.dtype = jnp.dtype(dtype)
    if self.dtype == jnp.float64 and not jax.config.jax_enable_x64:
      raise InputError("dtype float64 needs 64-bit JAX: run under `with jax.enable_x64(True):` "
                       "or set JAX_ENABLE_X64=1")
    z = np.broadcast_to(np.asarray(contact_impedance, np.float64), (NUM_ELECTRODES,))
    if np.any(z <= 0):
      raise InputError(f"contact_impedance must be > 0, got {contact_impedance}")
    n, ne = mesh.num_nodes, NUM_ELECTRODES
    size = n + ne - 1                                   # grounded: U_15 = 0 is dropped
    # element stiffness (E, 3, 3) for sigma = 1: (b b^T + c c^T) / (4 |T|)
    p = mesh.nodes[mesh.triangles]
    b = np.stack([p[:, 1, 1] - p[:, 2, 1], p[:, 2, 1] - p[:, 0, 1], p[:, 0, 1] - p[:, 1, 1]], 1)
    c = np.stack([p[:, 2, 0] - p[:, 1, 0], p[:, 0, 0] - p[:, 2, 0], p[:, 1, 0] - p[:, 0, 0]], 1)
    ke = (b[:, :, None] * b[:, None, :] + c[:, :, None] * c[:, None, :]) / (
        4 * mesh.areas()[:, None, None])
    full = np.zeros((n + ne, n + ne))
    for l, edges in enumerate(mesh.electrode_edges):
      length = 0.0
      for i, j in edges:
        h = np.linalg.norm(mesh.nodes[i] - mesh.nodes[j])
        length += h
        full[np.ix_([i, j], [i, j])] += h / (6 * z[l]) * np.array([[2, 1], [1, 2]])
        for k in (i, j):
          full[k, n + l] -= h / (2 * z[l])
          full[n + l, k] -= h / (2 * z[l])
      full[n + l, n + l] += length / z[l]
    full = full[:size, :size]
    var = np.ones(mesh.num_elements, bool) if support is None else np.asarray(support, bool)
    if var.shape != (mesh.num_elements,) or not var.any():
      raise InputError(f"support must be a non-empty boolean mask of the {mesh.num_elements} "
                       "elements")
    tri = mesh.triangles
    fixed = np.flatnonzero(~var)
    np.add.at(full, (tri[fixed][:, :, None], tri[fixed][:, None, :]), sigma_bg * ke[fixed])
    v_nodes = np.unique(tri[var])
    f_idx = np.setdiff1d(np.arange(size), v_nodes)
    # Schur complement onto V (constant part) and the maps back to electrode potentials
    a_ff, a_vf = full[np.ix_(f_idx, f_idx)], full[np.ix_(v_nodes, f_idx)]
    rhs = np.zeros((size, ne))
    rhs[n:] = PROTOCOL.currents(current).T[:ne - 1]    # column k: injection k
    inv_ff_fv = np.linalg.solve(a_ff, a_vf.T)           # (F, V)
    inv_ff_bf = np.linalg.solve(a_ff, rhs[f_idx])       # (F, 16)
    schur = full[np.ix_(v_nodes, v_nodes)] - a_vf @ inv_ff_fv
    elec = np.searchsorted(f_idx, np.arange(n, size))   # electrode rows within F
    self._schur = jnp.asarray(schur, self.dtype)
    self._rhs = jnp.asarray(-a_vf @ inv_ff_bf, self.dtype)       # (V, 16)
    self._elec_t = jnp.asarray(inv_ff_fv[elec], self.dtype)      # (15, V)
    self._elec_c = jnp.asarray(inv_ff_bf[elec], self.dtype)      # (15, 16)
    local = np.full(n, -1)
    local[v_nodes] = np.arange(len(v_nodes))
    vt = local[tri[var]]                                         # (E_var, 3) local indices
    self._var = jnp.asarray(np.flatnonzero(var), jnp.int32)
    self._ke = jnp.asarray(ke[var], self.dtype)
    self._rows = jnp.asarray(np.repeat(vt, 3, axis=1).reshape(-1), jnp.int32)
    self._cols = jnp.asarray(np.tile(vt, (1, 3)).reshape(-1), jnp.int32)
    self._m = jnp.asarray(PROTOCOL.pairs.reshape(-1), jnp.int32)
    self._m2 = jnp.asarray(PROTOCOL.second_electrodes().reshape(-1), jnp.int32)
    self._k = jnp.asarray(np.repeat(np.arange(ne), PROTOCOL.per_injection), jnp.int32)
    self.num_unknowns = len(v_nodes)

  @property
  def num_elements(self) -> int:
    return self.mesh.num_elements

  def system_matrix(self, sigma: jax.Array) -> jax.Array:
    """The condensed SPD matrix (V, V) for element conductivities sigma (E,)."""
    vals = (sigma[self._var, None, None] * self._ke).reshape(-1)
    return self._schur.at[self._rows, self._cols].add(vals)

  def electrode_potentials(self, sigma: jax.Array) -> jax.Array:
    """(16 electrodes, 16 injections) potentials for sigma (E,), electrode 15 grounded."""
    sigma = jnp.asarray(sigma, self.dtype)
    factor = jax.lax.stop_gradient(jnp.linalg.cholesky(self.system_matrix(sigma)))
    solve = lambda _, rhs: jax.scipy.linalg.cho_solve((factor, True), rhs)
    x = jax.lax.custom_linear_solve(lambda v: self.system_matrix(sigma) @ v, self._rhs,
                                    solve=solve, symmetric=True)
    u = self._elec_c - self._elec_t @ x
    return jnp.concatenate([u, jnp.zeros((1, NUM_ELECTRODES), u.dtype)], 0)

  def voltages(self, sigma: jax.Array) -> jax.Array:
    """The 208 measurements for element conductivities sigma (..., E), in CDEIT order and sign."""
    sigma = jnp.asarray(sigma, self.dtype)
    if sigma.ndim > 1:
      flat = sigma.reshape(-1, sigma.shape[-1])
      return jax.vmap(self.voltages)(flat).reshape(*sigma.shape[:-1], -1)
    u = self.electrode_potentials(sigma)
    return u[self._m, self._k] - u[self._m2, self._k]
