"""Random inclusion phantoms: parameters drawn on the host, rendered in JAX on mesh and grid.

A phantom is up to `MAX_INCLUSIONS` rows of `[active, kind, cx, cy, a, b, angle, v, p]`; every
shape lies inside the bounding circle |q - c| <= a and is turned by `angle`:
  disc      |q - c| <= a
  ellipse   semi-axes a, b
  half-disc |q - c| <= a on the side (cos angle, sin angle) of the line through c
  annulus   b a <= |q - c| <= a   (b: inner radius ratio)
  rectangle sides in the ratio b (short / long), corners on the circle, rounded by a quarter of
            the short half-side
  polygon   regular, p sides, corners on the circle
  star      r(phi) <= a (1 - b (1 - cos(p phi)) / 2): p lobes, depth b
with label v (`PhantomSpec`: |v| in [v_min, v_max], resistive objects' in their own range if
given) and conductivity sigma_bg * 10^v inside. Later rows win
where inclusions overlap (the generator draws them disjoint). The label at a point is what the
128 x 128 target shows (averaged over each pixel: area fraction times label); the conductivity
averaged over a triangle's sample points is the partial-volume conductivity the FEM sees.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.eit.measurement import IMAGE_SIZE
from cdeit_jax.eit.spec import KINDS, MAX_INCLUSIONS, MAX_SIDES, ROW, TARGETS, PhantomSpec

TRIES = 100  # candidate placements per inclusion before the phantom stops growing
STAR_DEPTH = (0.2, 0.5)
V = 7  # the label's column in a row


def _shape_b(kind, a, aspect, depth, spec: PhantomSpec, xp=jnp):
  """The row's `b` for each kind (0 where the kind has none)."""
  return xp.select(
    [
      kind == KINDS.index("ellipse"),
      kind == KINDS.index("annulus"),
      kind == KINDS.index("rectangle"),
      kind == KINDS.index("star"),
    ],
    [aspect * a, xp.full_like(a, spec.annulus_inner), aspect, depth],
    0.0,
  )


def _shape_p(kind, sides, xp=jnp):
  return xp.select(
    [kind == KINDS.index("polygon"), kind == KINDS.index("star")],
    [sides, xp.minimum(sides, MAX_SIDES - 1)],
    0,
  ).astype(xp.float32)


def draw_params(key: jax.Array, spec: PhantomSpec = PhantomSpec()) -> jax.Array:
  """(MAX_INCLUSIONS, ROW) float32 parameters of one random phantom with disjoint inclusions, a
  function of `key` alone (jit/vmap-able: the simulator data source draws them on the devices).

  The number of inclusions is uniform in [min_inclusions, max_inclusions]; each inclusion is the
  first of `TRIES` candidate placements (kind uniform over `spec.kinds`, bounding radius uniform
  in [min_size, max_size], centre uniform over the disk of radius max_radius - size, or on its
  edge with probability `near_wall`) that keeps `separation` from the inclusions placed before
  it; when none does, the phantom stops there (fewer inclusions). The angle is uniform and the
  label is +uniform(v_min, v_max) or -uniform(`PhantomSpec.resistive_range`), either sign
  equally likely. `random_params` draws the same distribution with numpy, sequentially.
  """
  kinds = jnp.asarray(spec.kind_ids(), jnp.int32)
  resistive = spec.resistive_range()  # the resistive objects' |label| range
  k_n, k_rest = jax.random.split(key)
  n = jax.random.randint(k_n, (), spec.min_inclusions, spec.max_inclusions + 1)
  rows, placed = [], []  # placed: (cx, cy, a, active) so far
  growing = jnp.bool_(True)
  for i in range(MAX_INCLUSIONS):
    ks = jax.random.split(jax.random.fold_in(k_rest, i), 11)
    kind = kinds[jax.random.randint(ks[0], (TRIES,), 0, len(kinds))]
    a = jax.random.uniform(ks[1], (TRIES,), minval=spec.min_size, maxval=spec.max_size)
    aspect = jax.random.uniform(ks[2], (TRIES,), minval=spec.min_aspect, maxval=1.0)
    depth = jax.random.uniform(ks[8], (TRIES,), minval=STAR_DEPTH[0], maxval=STAR_DEPTH[1])
    sides = jax.random.randint(ks[9], (TRIES,), 3, MAX_SIDES + 1)
    b = _shape_b(kind, a, aspect, depth, spec)
    wall = jax.random.bernoulli(ks[10], spec.near_wall, (TRIES,))
    rho = (spec.max_radius - a) * jnp.where(
      wall, 1.0, jnp.sqrt(jax.random.uniform(ks[3], (TRIES,)))
    )
    phi = jax.random.uniform(ks[4], (TRIES,), maxval=2 * np.pi)
    cx, cy = rho * jnp.cos(phi), rho * jnp.sin(phi)
    ok = jnp.ones((TRIES,), bool)
    for px, py, pa, pactive in placed:
      ok &= ~pactive | (jnp.hypot(cx - px, cy - py) >= a + pa + spec.separation)
    j = jnp.argmax(ok)  # the first acceptable candidate
    active = growing & (i < n) & ok[j]
    growing = active
    angle = jax.random.uniform(ks[5], (), maxval=2 * np.pi)
    sign = jnp.where(jax.random.bernoulli(ks[6]), 1.0, -1.0)
    lo = jnp.where(sign > 0, spec.v_min, resistive[0])
    hi = jnp.where(sign > 0, spec.v_max, resistive[1])
    v = sign * jax.random.uniform(ks[7], (), minval=lo, maxval=hi)
    row = jnp.stack(
      [
        1.0,
        kind[j].astype(jnp.float32),
        cx[j],
        cy[j],
        a[j],
        b[j],
        angle,
        v,
        _shape_p(kind[j], sides[j]),
      ]
    )
    rows.append(jnp.where(active, row, 0.0))
    placed.append((cx[j], cy[j], a[j], active))
  return jnp.stack(rows).astype(jnp.float32)


def random_params(rng: np.random.Generator, spec: PhantomSpec = PhantomSpec()) -> np.ndarray:
  """(MAX_INCLUSIONS, ROW) parameters of one random phantom with disjoint inclusions (numpy; the
  distribution of `draw_params`, which the simulator and the data source use)."""
  kinds = spec.kind_ids()
  out = np.zeros((MAX_INCLUSIONS, ROW))
  n = rng.integers(spec.min_inclusions, spec.max_inclusions + 1)
  placed = []  # (cx, cy, bounding radius)
  for i in range(n):
    for _ in range(TRIES):
      kind = kinds[rng.integers(len(kinds))]
      a = rng.uniform(spec.min_size, spec.max_size)
      aspect = rng.uniform(spec.min_aspect, 1.0)
      depth = rng.uniform(*STAR_DEPTH)
      sides = rng.integers(3, MAX_SIDES + 1)
      b = float(_shape_b(np.asarray(kind), a, aspect, depth, spec, np))
      wall = rng.uniform() < spec.near_wall
      rho = (spec.max_radius - a) * (1.0 if wall else np.sqrt(rng.uniform()))
      phi = rng.uniform(0, 2 * np.pi)
      cx, cy = rho * np.cos(phi), rho * np.sin(phi)
      if all(np.hypot(cx - x, cy - y) >= a + r + spec.separation for x, y, r in placed):
        break
    else:
      break  # no room left: fewer inclusions
    angle = rng.uniform(0, 2 * np.pi)
    sign = rng.choice([-1.0, 1.0])
    v = sign * rng.uniform(*((spec.v_min, spec.v_max) if sign > 0 else spec.resistive_range()))
    placed.append((cx, cy, a))
    out[i] = [1, kind, cx, cy, a, b, angle, v, float(_shape_p(np.asarray(kind), sides, np))]
  return out


def label_at(params: jax.Array, points: jax.Array) -> jax.Array:
  """Label (...) at points (..., 2) for one phantom's params (MAX_INCLUSIONS, ROW); 0 outside."""
  x, y = points[..., 0], points[..., 1]
  out = jnp.zeros(x.shape, params.dtype)
  for i in range(params.shape[0]):
    active, kind, cx, cy, a, b, ang, v, p = (params[i, j] for j in range(ROW))
    dx, dy = x - cx, y - cy
    r = jnp.hypot(dx, dy)
    ca, sa = jnp.cos(ang), jnp.sin(ang)
    u, w = ca * dx + sa * dy, -sa * dx + ca * dy  # rotated frame
    disc = r <= a
    ellipse = (u / a) ** 2 + (w / jnp.maximum(b, 1e-6)) ** 2 <= 1
    half = disc & (u >= 0)
    annulus = disc & (r >= b * a)
    hx = a / jnp.sqrt(1 + b * b)  # rectangle half-sides, corners at a
    hy = b * hx
    rc = 0.25 * hy
    qx, qy = jnp.maximum(jnp.abs(u) - (hx - rc), 0), jnp.maximum(jnp.abs(w) - (hy - rc), 0)
    rect = (jnp.abs(u) <= hx) & (jnp.abs(w) <= hy) & (qx * qx + qy * qy <= rc * rc)
    # polygon: inside every edge, whose normals point at angles (2k + 1) pi / n (no arctan:
    # this runs on ~10^5 points per inclusion and example)
    n = jnp.clip(p, 3.0, MAX_SIDES)
    polygon = jnp.ones(x.shape, bool)
    for k in range(MAX_SIDES):
      t = (2 * k + 1) * np.pi / n
      polygon &= (k >= n) | (u * jnp.cos(t) + w * jnp.sin(t) <= a * jnp.cos(np.pi / n))
    # star: cos(n phi) as the Chebyshev polynomial T_n of cos(phi) = u / r
    c = u / jnp.maximum(r, 1e-12)
    cheb = jnp.select(
      [n == 3, n == 4], [4 * c**3 - 3 * c, 8 * c**4 - 8 * c**2 + 1], 16 * c**5 - 20 * c**3 + 5 * c
    )
    star = r <= a * (1 - b * (1 - cheb) / 2)
    inside = jnp.select(
      [kind == k for k in range(len(KINDS))],
      [disc, ellipse, half, annulus, rect, polygon, star],
      False,
    )
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


# KTC2023's classes of a pixel: 0 water, 1 resistive, 2 conductive
NUM_CLASSES = 3
CLASS_LEVEL = 0.25  # half the smallest contrast the phantoms draw (0.5)


def class_map(label_image):
  """Classes (0 water, 1 resistive, 2 conductive) of a label image (each pixel's area fraction
  times its object's log10 conductivity ratio; numpy in, uint8 out; jax in, int32 out): 2 at
  +CLASS_LEVEL or more, 1 at -CLASS_LEVEL or less, so a pixel at least half covered by any
  object counts as that object's. The truth of a simulated target (the challenge's score, the
  class maps a segmenter learns)."""
  if isinstance(label_image, jax.Array):
    return jnp.where(label_image >= CLASS_LEVEL, 2, jnp.where(label_image <= -CLASS_LEVEL, 1, 0))
  out = np.zeros(np.shape(label_image), np.uint8)
  out[label_image >= CLASS_LEVEL] = 2
  out[label_image <= -CLASS_LEVEL] = 1
  return out


def disk_mask(size: int = IMAGE_SIZE) -> np.ndarray:
  """(size, size) True where the pixel centre lies inside the unit disk."""
  return (pixel_centres(size)[:, :, 0] ** 2).sum(-1) <= 1


def render_image(
  params: jax.Array, supersample: int = 4, size: int = IMAGE_SIZE, target: str = "label"
) -> jax.Array:
  """(size, size) target image: each pixel's area fraction times its label (0 outside the disk);
  `target="class"` draws sign(label) = +-1 instead (`PhantomSpec.target`)."""
  if target not in TARGETS:
    raise ValueError(f"target={target!r}: one of {TARGETS}")
  if target == "class":
    params = params.at[..., V].set(jnp.sign(params[..., V]))
  pts = jnp.asarray(pixel_centres(size, supersample), params.dtype)
  return label_at(params, pts).mean(-1)


def element_conductivity(
  params: jax.Array, sample_points: jax.Array, sigma_bg: float = 1.0
) -> jax.Array:
  """(E,) partial-volume conductivity: sigma_bg * 10^label averaged over each triangle's points."""
  return sigma_bg * jnp.mean(10.0 ** label_at(params, sample_points), axis=-1)


def pixel_index(points: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
  """Flat index of the pixel containing each point (..., 2) of [-1, 1]^2."""
  h = size / 2
  col = np.clip(np.floor(points[..., 0] * h + h), 0, size - 1).astype(np.int32)
  row = np.clip(np.floor(points[..., 1] * h + h), 0, size - 1).astype(np.int32)
  return row * size + col
