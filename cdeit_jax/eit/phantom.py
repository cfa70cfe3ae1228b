"""Random inclusion phantoms: parameters drawn on the host, rendered in JAX on mesh and grid.

A phantom is up to `MAX_INCLUSIONS` rows of `[active, kind, cx, cy, a, b, angle, v]`:
  disc      |p - c| <= a
  ellipse   semi-axes a, b, rotated by angle
  half-disc |p - c| <= a on the side (cos angle, sin angle) of the line through c
  annulus   b a <= |p - c| <= a   (b: inner radius ratio)
with label v in [-1, 1] (|v| >= v_min) and conductivity sigma_bg * 10^v inside. Later rows win
where inclusions overlap (the generator draws them disjoint). The label at a point is what the
128 x 128 target shows (averaged over each pixel: area fraction times label); the conductivity
averaged over a triangle's sample points is the partial-volume conductivity the FEM sees.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.eit.spec import KINDS, MAX_INCLUSIONS, PhantomSpec
from cdeit_jax.measurement import IMAGE_SIZE

TRIES = 100  # candidate placements per inclusion before the phantom stops growing


def draw_params(key: jax.Array, spec: PhantomSpec = PhantomSpec()) -> jax.Array:
  """(MAX_INCLUSIONS, 8) float32 parameters of one random phantom with disjoint inclusions, a
  function of `key` alone (jit/vmap-able: the simulator data source draws them on the devices).

  The number of inclusions is uniform in [min_inclusions, max_inclusions]; each inclusion is the
  first of `TRIES` candidate placements (kind uniform, size uniform in [min_size, max_size],
  centre uniform over the disk of radius max_radius - size) that keeps `separation` from the
  inclusions placed before it; when none does, the phantom stops there (fewer inclusions). The
  angle is uniform and the label is +-uniform(v_min, v_max). `random_params` draws the same
  distribution with numpy, sequentially.
  """
  k_n, k_rest = jax.random.split(key)
  n = jax.random.randint(k_n, (), spec.min_inclusions, spec.max_inclusions + 1)
  rows, placed = [], []                               # placed: (cx, cy, a, active) so far
  growing = jnp.bool_(True)
  for i in range(MAX_INCLUSIONS):
    ks = jax.random.split(jax.random.fold_in(k_rest, i), 8)
    kind = jax.random.randint(ks[0], (TRIES,), 0, len(KINDS))
    a = jax.random.uniform(ks[1], (TRIES,), minval=spec.min_size, maxval=spec.max_size)
    aspect = jax.random.uniform(ks[2], (TRIES,), minval=spec.min_aspect, maxval=1.0)
    b = jnp.where(kind == KINDS.index("ellipse"), aspect * a,
                  jnp.where(kind == KINDS.index("annulus"), spec.annulus_inner, 0.0))
    rho = (spec.max_radius - a) * jnp.sqrt(jax.random.uniform(ks[3], (TRIES,)))
    phi = jax.random.uniform(ks[4], (TRIES,), maxval=2 * np.pi)
    cx, cy = rho * jnp.cos(phi), rho * jnp.sin(phi)
    ok = jnp.ones((TRIES,), bool)
    for px, py, pa, pactive in placed:
      ok &= ~pactive | (jnp.hypot(cx - px, cy - py) >= a + pa + spec.separation)
    j = jnp.argmax(ok)                                # the first acceptable candidate
    active = growing & (i < n) & ok[j]
    growing = active
    angle = jax.random.uniform(ks[5], (), maxval=2 * np.pi)
    sign = jnp.where(jax.random.bernoulli(ks[6]), 1.0, -1.0)
    v = sign * jax.random.uniform(ks[7], (), minval=spec.v_min, maxval=spec.v_max)
    row = jnp.stack([1.0, kind[j].astype(jnp.float32), cx[j], cy[j], a[j], b[j], angle, v])
    rows.append(jnp.where(active, row, 0.0))
    placed.append((cx[j], cy[j], a[j], active))
  return jnp.stack(rows).astype(jnp.float32)


def random_params(rng: np.random.Generator, spec: PhantomSpec = PhantomSpec()) -> np.ndarray:
  """(MAX_INCLUSIONS, 8) parameters of one random phantom with disjoint inclusions (numpy; the
  distribution of `draw_params`, which the simulator and the data source use)."""
  out = np.zeros((MAX_INCLUSIONS, 8))
  n = rng.integers(spec.min_inclusions, spec.max_inclusions + 1)
  placed = []                                       # (cx, cy, bounding radius)
  for i in range(n):
    for _ in range(100):
      kind = rng.integers(len(KINDS))
      a = rng.uniform(spec.min_size, spec.max_size)
      b = rng.uniform(spec.min_aspect, 1.0) * a if KINDS[kind] == "ellipse" else (
          spec.annulus_inner if KINDS[kind] == "annulus" else 0.0)
      rho = (spec.max_radius - a) * np.sqrt(rng.uniform())
      phi = rng.uniform(0, 2 * np.pi)
      cx, cy = rho * np.cos(phi), rho * np.sin(phi)
      if all(np.hypot(cx - x, cy - y) >= a + r + spec.separation for x, y, r in placed):
        break
    else:
      break                                         # no room left: fewer inclusions
    angle = rng.uniform(0, 2 * np.pi)
    v = rng.choice([-1.0, 1.0]) * rng.uniform(spec.v_min, spec.v_max)
    placed.append((cx, cy, a))
    out[i] = [1, kind, cx, cy, a, b, angle, v]
  return out


def label_at(params: jax.Array, points: jax.Array) -> jax.Array:
  """Label (...) at points (..., 2) for one phantom's params (MAX_INCLUSIONS, 8); 0 outside."""
  x, y = points[..., 0], points[..., 1]
  out = jnp.zeros(x.shape, params.dtype)
  for i in range(params.shape[0]):
    active, kind, cx, cy, a, b, ang, v = (params[i, j] for j in range(8))
    dx, dy = x - cx, y - cy
    r = jnp.hypot(dx, dy)
    ca, sa = jnp.cos(ang), jnp.sin(ang)
    u, w = ca * dx + sa * dy, -sa * dx + ca * dy             # rotated frame
    disc = r <= a
    ellipse = (u / a) ** 2 + (w / jnp.maximum(b, 1e-6)) ** 2 <= 1
    half = disc & (u >= 0)
    annulus = disc & (r >= b * a)
    inside = jnp.select([kind == 0, kind == 1, kind == 2, kind == 3],
                        [disc, ellipse, half, annulus], False)
    out = jnp.where(inside & (active > 0), v, out)
  return jnp.where(x * x + y * y <= 1, out, 0.0)


def pixel_centres(size: int = IMAGE_SIZE, supersample: int = 1) -> np.ndarray:
  """(size, size, s*s, 2) points of each pixel: xs[row, col] is at ((col - c) / h, (row - c) / h),
  c = (size - 1) / 2, h = size / 2 (row grows with +y), with s x s sub-pixel offsets."""
  h, c = size / 2, (size - 1) / 2
  off = (np.arange(supersample) + 0.5) / supersample - 0.5
  col = (np.arange(size)[None, :, None, None] + off[None, None, None, :] - c) / h
  row = (np.arange(size)[:, None, None, None] + off[None, None, :, None] - c) / h
  col, row = np.broadcast_arrays(col, row)
  return np.stack([col, row], -1).reshape(size, size, supersample * supersample, 2)


def disk_mask(size: int = IMAGE_SIZE) -> np.ndarray:
  """(size, size) True where the pixel centre lies inside the unit disk."""
  return (pixel_centres(size)[:, :, 0] ** 2).sum(-1) <= 1


def render_image(params: jax.Array, supersample: int = 4, size: int = IMAGE_SIZE) -> jax.Array:
  """(size, size) target image: each pixel's area fraction times its label (0 outside the disk)."""
  pts = jnp.asarray(pixel_centres(size, supersample), params.dtype)
  return label_at(params, pts).mean(-1)


def element_conductivity(params: jax.Array, sample_points: jax.Array,
                         sigma_bg: float = 1.0) -> jax.Array:
  """(E,) partial-volume conductivity: sigma_bg * 10^label averaged over each triangle's points."""
  return sigma_bg * jnp.mean(10.0 ** label_at(params, sample_points), axis=-1)


def pixel_index(points: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
  """Flat index of the pixel containing each point (..., 2) of [-1, 1]^2."""
  h = size / 2
  col = np.clip(np.floor(points[..., 0] * h + h), 0, size - 1).astype(np.int32)
  row = np.clip(np.floor(points[..., 1] * h + h), 0, size - 1).astype(np.int32)
  return row * size + col
