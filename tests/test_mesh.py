"""The disk mesh (`eit.mesh`): its electrodes and area."""

import numpy as np

from cdeit_jax import eit


def test_mesh_electrodes_and_area():
  m = eit.make_mesh()
  assert np.all(m.areas() > 0)
  assert abs(m.areas().sum() - np.pi) / np.pi < 2e-3  # inscribed polygon of the unit circle
  ends = eit.electrode_angles(4.0)
  for l, edges in enumerate(m.electrode_edges):
    ang = np.unwrap(np.arctan2(m.nodes[edges][..., 1], m.nodes[edges][..., 0]).ravel())
    centre = np.pi / 2 - 2 * np.pi * l / 16  # electrode 0 on top, clockwise
    assert np.isclose(np.angle(np.exp(1j * (ang.mean() - centre))), 0, atol=1e-9)
    assert np.isclose(ang.max() - ang.min(), np.deg2rad(4.0), atol=1e-9)
    assert np.allclose(np.abs(m.nodes[edges]).sum(-1) > 0, True)
  assert np.allclose(ends[:, 1] - ends[:, 0], np.deg2rad(4.0))
