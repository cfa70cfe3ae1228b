"""Unit-disk triangular mesh with 16 electrodes, refined towards the boundary (numpy, built once);
any other count of evenly spaced electrodes with `MeshSpec.num_electrodes` and `offset_deg`
(`spec_for` makes the spec of a measuring system's layout).

Electrode l (0-based) is centred at polar angle pi/2 - 2 pi l / 16 (electrode 0 at (0, 1), numbered
clockwise), `width_deg` wide; its ends are mesh nodes, so an electrode is a run of boundary edges.
Nodes lie on concentric rings: the boundary ring is graded (fine at electrode ends, where the
current density is singular), interior rings coarsen with depth; scipy's Delaunay triangulates them.
A ring
mesher rather than a general one (gmsh, meshpy) keeps the package free of compiled mesh tools and
makes the mesh deterministic and identical everywhere.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from scipy.spatial import Delaunay

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import NUM_ELECTRODES


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """Mesh resolution. The defaults give 1,702 nodes; see tests/test_fem.py for its accuracy."""

  width_deg: float = 4.0  # electrode angular width
  electrode_edges: int = 4  # boundary edges per electrode
  gap_edges: int = 12  # boundary edges between two electrodes (graded)
  h_interior: float = 0.075  # edge length deep inside
  refine_depth: float = 0.35  # depth over which the size grows from the boundary's to
  # h_interior
  num_electrodes: int = NUM_ELECTRODES  # evenly spaced, one centred at pi/2 + offset_deg
  offset_deg: float = 0.0


def spec_for(layout: Layout) -> MeshSpec:
  """The mesh of a measuring system's layout (evenly spaced electrodes): boundary nodes at the
  ends of its electrodes, about as many boundary edges as the default's 256; CDEIT's 16
  electrodes of 4 degrees give the default itself."""
  num_electrodes, first_angle, width = layout.num_electrodes, float(layout.angles[0]), layout.width
  step = 360.0 / num_electrodes
  offset = float(np.mod(np.rad2deg(first_angle) - 90.0 + step / 2, step) - step / 2)
  if num_electrodes == NUM_ELECTRODES and abs(offset) < 1e-9:
    return dataclasses.replace(MeshSpec(), width_deg=float(np.round(np.rad2deg(width), 9)))
  per = 256 // num_electrodes
  return MeshSpec(
    width_deg=float(np.round(np.rad2deg(width), 9)),
    electrode_edges=max(2, per // 4),
    gap_edges=max(3, per - max(2, per // 4)),
    num_electrodes=num_electrodes,
    offset_deg=offset,
  )


@dataclasses.dataclass(frozen=True)
class DiskMesh:
  nodes: np.ndarray  # (N, 2) float64
  triangles: np.ndarray  # (E, 3) int32, counter-clockwise
  boundary: np.ndarray  # (B,) node indices of the boundary ring, counter-clockwise
  electrode_edges: tuple  # per electrode: (k, 2) node index pairs of its boundary edges
  spec: MeshSpec

  @property
  def num_nodes(self) -> int:
    return len(self.nodes)

  @property
  def num_elements(self) -> int:
    return len(self.triangles)

  def areas(self) -> np.ndarray:
    p = self.nodes[self.triangles]
    d1, d2 = p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]
    return 0.5 * (d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])

  def sample_points(self, n: int = 4) -> np.ndarray:
    """(E, n*n, 2) centroids of each triangle's n x n uniform sub-triangles (equal areas), for
    partial-volume averages over a triangle."""
    bary = []
    for i in range(n):
      for j in range(n - i):
        bary.append(((i + 1 / 3) / n, (j + 1 / 3) / n))  # upward sub-triangle
        if i + j < n - 1:
          bary.append(((i + 2 / 3) / n, (j + 2 / 3) / n))  # downward one
    b = np.array(bary)  # (n*n, 2): weights of vertices 1, 2
    w = np.concatenate([1 - b.sum(1, keepdims=True), b], 1)  # (n*n, 3)
    return np.einsum("sk,ekd->esd", w, self.nodes[self.triangles])


def electrode_angles(width_deg: float = 4.0) -> np.ndarray:
  """(16, 2) start and end polar angle (radians, counter-clockwise) of each electrode."""
  centre = np.pi / 2 - 2 * np.pi * np.arange(NUM_ELECTRODES) / NUM_ELECTRODES
  half = np.deg2rad(width_deg) / 2
  return np.stack([centre - half, centre + half], 1)


def _boundary_angles(spec: MeshSpec) -> tuple[np.ndarray, np.ndarray]:
  """Boundary node angles in [0, 2 pi), ascending, and the electrode owning each edge (-1: gap)."""
  half = np.deg2rad(spec.width_deg) / 2
  ne = spec.num_electrodes
  step = 2 * np.pi / ne
  gap = step - 2 * half
  if not gap > 0:
    raise InputError(f"mesh: {ne} electrodes {spec.width_deg} degrees wide overlap")
  # electrodes in counter-clockwise order starting at angle pi/2 - half: l = 0, 15, 14, ...
  angles, owner = [], []
  t_gap = np.linspace(0, 1, spec.gap_edges + 1)[:-1]
  h_e = 2 * half / spec.electrode_edges
  # gap grading: phi(t) = t - c sin(2 pi t) / (2 pi), spacing at the ends = electrode spacing
  c = 1 - min(1.0, h_e * spec.gap_edges / gap)
  phi = t_gap - c * np.sin(2 * np.pi * t_gap) / (2 * np.pi)
  for i in range(ne):
    l = (-i) % ne
    start = np.pi / 2 + np.deg2rad(spec.offset_deg) - half + i * step
    angles += list(start + np.arange(spec.electrode_edges) * h_e)
    owner += [l] * spec.electrode_edges
    angles += list(start + 2 * half + phi * gap)
    owner += [-1] * spec.gap_edges
  return np.mod(np.array(angles), 2 * np.pi), np.array(owner)


@functools.lru_cache(maxsize=8)
def make_mesh(spec: MeshSpec = MeshSpec()) -> DiskMesh:
  theta, owner = _boundary_angles(spec)
  order = np.argsort(theta, kind="stable")
  theta, owner = theta[order], owner[order]  # owner[i]: electrode of edge (i, i+1)
  pts = [np.stack([np.cos(theta), np.sin(theta)], 1)]
  h_b = 2 * np.pi / len(theta)  # mean boundary spacing
  size = lambda r: h_b + (spec.h_interior - h_b) * min(1.0, (1 - r) / spec.refine_depth)
  r, ring = 1.0, 0
  while True:
    r -= np.sqrt(3) / 2 * size(r)
    if r < 0.5 * spec.h_interior:
      break
    n = max(6, int(round(2 * np.pi * r / size(r))))
    ring += 1
    a = (np.arange(n) + 0.5 * (ring % 2)) * 2 * np.pi / n
    pts.append(r * np.stack([np.cos(a), np.sin(a)], 1))
  pts.append(np.zeros((1, 2)))
  nodes = np.concatenate(pts)
  tri = Delaunay(nodes, qhull_options="Qbb Qc Qz Q12").simplices
  p = nodes[tri]
  area = 0.5 * (
    (p[:, 1, 0] - p[:, 0, 0]) * (p[:, 2, 1] - p[:, 0, 1])
    - (p[:, 1, 1] - p[:, 0, 1]) * (p[:, 2, 0] - p[:, 0, 0])
  )
  tri = np.where((area < 0)[:, None], tri[:, [0, 2, 1]], tri)
  tri = tri[np.abs(area) > 1e-12].astype(np.int32)
  b = len(theta)
  boundary = np.arange(b)
  edges = tuple(
    np.array([(i, (i + 1) % b) for i in range(b) if owner[i] == l], np.int32)
    for l in range(spec.num_electrodes)
  )
  return DiskMesh(nodes=nodes, triangles=tri, boundary=boundary, electrode_edges=edges, spec=spec)
