"""The priors of the linear images (`eit.conditioning`'s channels, config.model.cond_priors) as
reconstruction matrices, each at every level alpha, after KTC2023's winners, who stacked
linearised reconstructions of several priors as the network's input channels:

  "noser":   NOSER-weighted Tikhonov, W^-1 J^T (J W^-1 J^T + lambda I)^-1, W = diag(J^T J)^0.5
             (the one prior before; lambda = alpha * trace(G) / values left);
  "laplace": a smoothness penalty on the image's graph Laplacian L (4-neighbours in the disk),
             (J^T J + lambda L^T L)^-1 J^T, lambda = alpha * trace(J^T J) / trace(L^T L);
  "smooth":  a Gaussian prior of correlation length SMOOTH_LENGTH (of the tank's radius),
             Gamma J^T (J Gamma J^T + lambda I)^-1, lambda = alpha * trace(J Gamma J^T) / values;

and the spectral filters 1 / (s + lambda) of the levels, which CDEIT's linear conditioner and its
data consistency share.
"""

from __future__ import annotations

import numpy as np

from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit import tikhonov

SMOOTH_LENGTH = 0.2


def filters(spectrum: np.ndarray, alphas) -> np.ndarray:
  """(levels, 208) spectral filters 1 / (s + lambda_alpha), lambda = alpha * trace(G) / 208."""
  s = np.asarray(spectrum, np.float64)
  lam = np.asarray(alphas, np.float64)[:, None] * s.sum() / s.size
  return 1.0 / (s[None] + lam)


def grid_laplacian(disk: np.ndarray) -> np.ndarray:
  """(P, P) graph Laplacian of the disk pixels (`disk` (g*g,) bool) with their 4 neighbours in
  the disk: D - A, rows summing to zero (a constant image is not penalised)."""
  g = int(round(np.sqrt(disk.size)))
  index = np.full(g * g, -1)
  index[disk] = np.arange(int(disk.sum()))
  index = index.reshape(g, g)
  lap = np.zeros((int(disk.sum()),) * 2)
  for di, dj in ((0, 1), (1, 0)):
    a, b = index[: g - di, : g - dj], index[di:, dj:]
    both = (a >= 0) & (b >= 0)
    i, j = a[both], b[both]
    lap[i, j] = lap[j, i] = -1.0
  lap[np.diag_indices_from(lap)] = -lap.sum(1)
  return lap


def gaussian_prior(disk: np.ndarray, length: float = SMOOTH_LENGTH) -> np.ndarray:
  """(P, P) covariance exp(-d^2 / (2 length^2)) between the disk pixels' centres (d in the
  tank's radii; pixel centres of the grid over [-1, 1]^2)."""
  g = int(round(np.sqrt(disk.size)))
  c = (np.arange(g) + 0.5) / g * 2 - 1
  yy, xx = np.meshgrid(c, c, indexing="ij")
  pts = np.stack([xx.ravel(), yy.ravel()], -1)[disk]
  d2 = ((pts[:, None] - pts[None]) ** 2).sum(-1)
  return np.exp(-d2 / (2 * length**2))


def prior_matrices(jac: np.ndarray, prior: str, alphas, noser_exponent: float) -> np.ndarray:
  """(levels, disk pixels, values) reconstruction matrices of `prior` (`conditioning.PRIORS`) for
  the Jacobian `jac` (values, g, g) of the values a set leaves, in float64."""
  if prior == "noser":
    _, jd, w_inv, gram = tikhonov.weighted_system(jac, noser_exponent)
    return _filtered(gram, w_inv[:, None] * jd.T, alphas)
  disk = ph.disk_mask(jac.shape[-1]).reshape(-1)
  jd = np.asarray(jac, np.float64).reshape(len(jac), -1)[:, disk]
  if prior == "smooth":
    cov_jt = gaussian_prior(disk) @ jd.T  # Gamma J^T
    return _filtered(jd @ cov_jt, cov_jt, alphas)
  # "laplace": (J^T J + lambda L^T L)^-1 J^T, solved once per level (pixels x pixels)
  jtj = jd.T @ jd
  reg = grid_laplacian(disk)
  reg = reg.T @ reg
  scale = np.trace(jtj) / np.trace(reg)
  return np.stack(
    [np.linalg.solve(jtj + float(a) * scale * reg, jd.T) for a in np.asarray(alphas, np.float64)]
  )


def _filtered(gram: np.ndarray, cov_jt: np.ndarray, alphas) -> np.ndarray:
  """Gamma J^T (J Gamma J^T + lambda I)^-1 at each level, from one eigendecomposition of the
  values' Gram matrix `gram` = J Gamma J^T and `cov_jt` = Gamma J^T (pixels, values)."""
  s, u = np.linalg.eigh((gram + gram.T) / 2)
  left = cov_jt @ u
  return np.stack([(left * f) @ u.T for f in filters(np.maximum(s, 0.0), alphas)])
