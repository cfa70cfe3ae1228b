"""The Tikhonov/NOSER reconstruction (`eit.tikhonov`): its dual form equals the primal, and it finds
a disc."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import disc_params

from cdeit_jax import eit
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit import tikhonov
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values


def test_tikhonov_dual_form_equals_primal():
  """W^-1 J^T (J W^-1 J^T + lam I)^-1 == (J^T J + lam W)^-1 J^T on a small random Jacobian."""
  rng = np.random.default_rng(0)
  disk = (ph.pixel_centres(128)[:, :, 0] ** 2).sum(-1).reshape(-1) <= 1
  small = rng.standard_normal((208, 300))
  jac = np.zeros((208, 128 * 128))
  jac[:, np.flatnonzero(disk)[:300]] = small  # the other pixels see nothing
  t = tikhonov.Tikhonov(jac=jac.reshape(208, 128, 128), alpha=0.1, noser_exponent=1.0)
  w = (small * small).sum(0)
  lam = 0.1 * np.trace((small / w) @ small.T) / 208
  primal = np.linalg.solve(small.T @ small + lam * np.diag(w), small.T)
  assert np.all(t.matrix[300:] == 0)
  np.testing.assert_allclose(t.matrix[:300], primal, rtol=1e-6, atol=1e-9)


def test_tikhonov_finds_a_disc():
  sim = eit.default_simulator(CDEIT16)
  params = disc_params(0.45, -0.3, 0.2, 10.0)
  ys = np.asarray(sim.phantom_voltages(params[None], 40.0, jax.random.split(jax.random.key(1), 1)))
  rec = eit.default_tikhonov(CDEIT16)(ys)[0]
  target = np.asarray(ph.render_image(jnp.asarray(params, jnp.float32)))
  assert rec.shape == (128, 128) and rec[0, 0] == 0
  row, col = np.unravel_index(np.argmax(rec), rec.shape)  # conductive: a positive peak
  x, y = (col - 63.5) / 64, (row - 63.5) / 64
  assert np.hypot(x - 0.45, y + 0.3) < 0.15
  assert np.corrcoef(rec.ravel(), target.ravel())[0, 1] > 0.5
