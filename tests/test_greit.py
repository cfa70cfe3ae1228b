"""eit.greit: the GREIT reconstruction matrix against pyEIT's own on pyEIT's mesh and Jacobian,
the desired images' FFT form against the dense one, and the noise figure the weight is chosen
for on CDEIT's system."""

import numpy as np
import pytest

from cdeit_jax.eit import greit, layout, phantom, tikhonov


def test_the_matrix_is_pyeits_on_pyeits_own_mesh_and_jacobian():
  """pyEIT 1.2.4's GREIT ("dist": R = W^T J^T (J J^T + lamb diag(J J^T)^p)^-1, W its sigmoid
  weights normalised over the elements) on its 16-electrode mesh: `reconstruction_matrix` of
  its Jacobian with `desired_weights` at its radius ratio * d_max and 5 s / d_max is its H."""
  from pyeit import mesh
  from pyeit.eit import protocol
  from pyeit.eit.greit import GREIT

  m = mesh.create(16, h0=0.1)
  g = GREIT(m, protocol.create(16, dist_exc=1, step_meas=1, parser_meas="std"))
  ratio, s, lamb, p = 0.1, 20.0, 0.01, 0.5
  g.setup(p=p, lamb=lamb, n=32, s=s, ratio=ratio)
  centres = m.elem_centers[:, :2]
  grid = np.stack([g.xg.ravel(), g.yg.ravel()], 1)
  d_max = np.linalg.norm(centres[:, None] - grid[None], axis=-1).max()
  w = greit.desired_weights(centres, grid, radius=ratio * d_max, steepness=5 * s / d_max)
  got = greit.reconstruction_matrix(g.J, w, lamb, noise_exponent=p)
  assert got.shape == g.H.shape == (32 * 32, 208)
  np.testing.assert_allclose(got, g.H, rtol=1e-9, atol=1e-12 * np.abs(g.H).max())


def test_the_fft_desired_images_equal_the_dense_weights_on_the_pixels():
  size, radius, steepness = 24, 0.3, 20.0
  disk = phantom.disk_mask(size)
  centres = phantom.pixel_centres(size)[:, :, 0][disk]
  w = greit.desired_weights(centres, centres, radius, steepness)
  v = np.random.default_rng(0).standard_normal((disk.sum(), 5))
  np.testing.assert_allclose(greit.PixelBlur(size, radius, steepness)(v), w.T @ v, atol=1e-12)


def test_the_weight_gives_the_noise_figure_asked_on_cdeit16():
  """On CDEIT's 16 electrodes the centre target's noise figure (the simulator's noise, 64 draws)
  is 0.5, as the weight was chosen for; its images are `reconstruction_matrix`'s (the formula
  checked against pyEIT) with its weight and the FFT desired images, as `of_values` gives them;
  the images of the GREIT test's targets peak where the targets are and are in label units (the
  blurred truth's scale)."""
  lay = layout.preset("cdeit16")
  centre = greit.target_params(np.zeros((1, 2)))
  y0 = greit.target_voltages(lay, centre)[0]
  noise = greit.noise_draws(lay, y0)
  jac = tikhonov.layout_jacobian(lay)
  rec = greit.Greit(jac, y0, noise)
  disk = phantom.disk_mask(128)
  jd = jac.reshape(len(jac), -1)[:, disk.reshape(-1)]
  blur = greit.PixelBlur(128, greit.DESIRED_RADIUS, 10 / greit.DESIRED_RADIUS)
  matrix = greit.reconstruction_matrix(jd, blur, rec.lam)
  want = matrix @ y0
  np.testing.assert_allclose(rec(y0)[disk], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
  np.testing.assert_array_equal(greit.of_values(lay)(y0), rec(y0))
  nf = greit.noise_figure(y0, noise, rec(y0), rec(y0 + noise), disk)
  assert nf == pytest.approx(greit.NOISE_FIGURE, rel=1e-3)
  tik = tikhonov.default_tikhonov(lay)
  assert greit.noise_figure(y0, noise, tik(y0), tik(y0 + noise), disk) > 0.6  # noisier
  pos = np.array([[0.0, 0.0], [0.5, 0.0], [0.0, -0.7]])
  images = rec(greit.target_voltages(lay, greit.target_params(pos)))
  peaks = np.array([np.unravel_index(np.argmax(im), im.shape) for im in images])
  xy = phantom.pixel_centres(128)[peaks[:, 0], peaks[:, 1], 0]
  np.testing.assert_allclose(xy, pos, atol=0.1)
  truth_sum = np.pi * greit.TARGET_RADIUS**2 / (2 / 128) ** 2  # label 1 over the target's pixels
  assert 0.3 < images[0].sum() / truth_sum < 3
