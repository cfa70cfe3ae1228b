"""Held-out shape families: simulated test targets whose shapes the phantom generator never draws
(`eit.spec.KINDS` are discs, ellipses, half discs, annuli, rectangles, convex polygons and
stars, their bounding circles kept apart), a yardstick that choosing on the generator's own
validation split cannot fit.

The families (`FAMILIES`), each object a membership test on points of the unit disk:
- "letters": capital letters without holes (DejaVu Sans Bold, matplotlib's own font), turned;
- "blobs": random smooth outlines, r(theta) = a (1 + sum of harmonics 2..5), mostly concave;
- "thin": bars 0.04-0.08 of the radius wide, and arcs of that thickness;
- "concave": crescents, L shapes and C shapes (annular sectors of 240-300 degrees);
- "touching": pairs of discs or ellipses in contact (their outlines overlap by 0.01 of the
  radius), of one class or both.

Two groups of targets, as KTC2023's levels ask: "few" (1-4 objects, each resistive or
conductive at random: levels 1-4) and "many" (3-4 objects, both classes in each: levels 5-7).
Each target's objects are of one family (target i: `FAMILIES[i % 5]`). Contrasts are the
config's (`eit.spec.PhantomSpec`'s v ranges). The label image is each pixel's area fraction
times its object's v (4 x 4 points a pixel, as `eit.phantom.render_image`); the voltages are the
config's simulator's for the element conductivities at its sample points (as
`Simulator.phantom_conductivity`), each target measured by its own system drawn as the config
draws (`data.synthetic.Generator.systems`) with the config's noise. The files are the
simulator's (`NNNNNNN.npz`: `ys` (R, 1), `xs` (128, 128)), so eval.py (`--data simulated`) and
`cdeit_jax.answer_study --sims` read them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable

import numpy as np

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.data.npz_files import file_name, savez

RECORD = "heldout.json"  # beside the groups' folders: each file's family, objects and classes
FAMILIES = ("letters", "blobs", "thin", "concave", "touching")
GROUPS = {"few": (1, 4, False), "many": (3, 4, True)}  # objects min, max; both classes
LETTERS = "CEFGHIJKLMNSTUVWXYZ"  # capitals without holes (a hole would be water inside)
SEED_OFFSET = 7_919  # keys apart from any split's (data.synthetic.example_key)
GAP = 0.03  # between objects' bounding circles (the generator's separation)
TOUCH = 0.01  # how far a touching pair's outlines overlap (radius units)
MANY_SIZE = (0.2, 0.4)  # bounding radii of a target's objects when it has several

Shape = Callable[[np.ndarray], np.ndarray]  # points (N, 2) -> inside (N,) bool


@dataclasses.dataclass(frozen=True)
class Target:
  """One held-out target: its objects (membership tests) and their log10 contrasts."""

  family: str
  shapes: tuple[Shape, ...]
  v: tuple[float, ...]

  def label(self, points: np.ndarray) -> np.ndarray:
    """log10 conductivity ratio at points (..., 2): the v of the object holding each point (a
    point in two touching objects takes the first's)."""
    flat = points.reshape(-1, 2)
    out = np.zeros(len(flat))
    free = np.ones(len(flat), bool)
    for shape, v in zip(self.shapes, self.v):
      inside = shape(flat) & free
      out[inside] = v
      free &= ~inside
    return out.reshape(points.shape[:-1])


def _rotated(points: np.ndarray, centre, angle: float) -> np.ndarray:
  """Points in a frame at `centre`, turned by -angle (the shape's own frame)."""
  c, s = math.cos(angle), math.sin(angle)
  d = points - np.asarray(centre)
  return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], -1)


def _letter(rng: np.random.Generator, centre, a: float) -> Shape:
  from matplotlib.font_manager import FontProperties
  from matplotlib.path import Path
  from matplotlib.textpath import TextPath

  path = TextPath(
    (0, 0),
    str(rng.choice(list(LETTERS))),
    size=1.0,
    prop=FontProperties(family="DejaVu Sans", weight="bold"),
  )
  v = path.vertices
  mid = (v.min(0) + v.max(0)) / 2
  scale = a / np.hypot(*(v - mid).T).max()  # its bounding circle has radius a
  path = Path((v - mid) * scale, path.codes)
  angle = rng.uniform(0, 2 * math.pi)
  return lambda p: path.contains_points(_rotated(p, centre, angle))


def _blob(rng: np.random.Generator, centre, a: float) -> Shape:
  k = np.arange(2, 6)
  amp = rng.uniform(0.0, 0.3, len(k)) / np.sqrt(k - 1)
  phase = rng.uniform(0, 2 * math.pi, len(k))
  theta = np.linspace(0, 2 * math.pi, 721)
  peak = (1 + (amp[:, None] * np.cos(k[:, None] * theta + phase[:, None])).sum(0)).max()

  def inside(p):
    d = p - np.asarray(centre)
    t = np.arctan2(d[:, 1], d[:, 0])
    r = a / peak * (1 + (amp[:, None] * np.cos(k[:, None] * t + phase[:, None])).sum(0))
    return np.hypot(d[:, 0], d[:, 1]) < r

  return inside


def _sector(centre, radius: float, width: float, start: float, span: float) -> Shape:
  """An annular sector: radii radius - width .. radius, angles start .. start + span."""

  def inside(p):
    d = p - np.asarray(centre)
    r = np.hypot(d[:, 0], d[:, 1])
    t = np.mod(np.arctan2(d[:, 1], d[:, 0]) - start, 2 * math.pi)
    return (r < radius) & (r > radius - width) & (t < span)

  return inside


def _thin(rng: np.random.Generator, centre, a: float) -> Shape:
  width = rng.uniform(0.04, 0.08)
  if rng.random() < 0.5:  # a bar as long as its bounding circle
    angle = rng.uniform(0, math.pi)
    return lambda p: np.all(np.abs(_rotated(p, centre, angle)) < [a, width / 2], axis=1)
  span = rng.uniform(math.pi / 2, 4 * math.pi / 3)
  return _sector(centre, a, width, rng.uniform(0, 2 * math.pi), span)


def _concave(rng: np.random.Generator, centre, a: float) -> Shape:
  kind = rng.integers(3)
  angle = rng.uniform(0, 2 * math.pi)
  if kind == 0:  # a crescent: the disc less a disc moved off its centre
    cut, shift = rng.uniform(0.7, 0.9) * a, rng.uniform(0.35, 0.6) * a
    off = np.asarray(centre) + shift * np.array([math.cos(angle), math.sin(angle)])
    return lambda p: (np.hypot(*(p - centre).T) < a) & (np.hypot(*(p - off).T) > cut)
  if kind == 1:  # an L: two bars sharing a corner, inside the bounding circle
    t = rng.uniform(0.3, 0.45) * a
    s = a / math.sqrt(2)

    def inside(p):
      q = _rotated(p, centre, angle)
      box = np.all(np.abs(q) < s, axis=1)
      return box & ((q[:, 0] < -s + 2 * t) | (q[:, 1] < -s + 2 * t))

    return inside
  return _sector(centre, a, rng.uniform(0.3, 0.5) * a, angle, rng.uniform(4, 5) * math.pi / 3)


def _ellipse(centre, a: float, b: float, angle: float) -> Shape:
  return lambda p: ((_rotated(p, centre, angle) / [a, b]) ** 2).sum(1) < 1


MAKERS = {"letters": _letter, "blobs": _blob, "thin": _thin, "concave": _concave}


def _signs(rng: np.random.Generator, n: int, both: bool) -> np.ndarray:
  """+1 conductive, -1 resistive per object; with `both`, one of each at least."""
  while True:
    s = rng.choice([-1.0, 1.0], n)
    if not both or (s > 0).any() and (s < 0).any():
      return s


def _places(rng: np.random.Generator, sizes, max_radius: float, tries: int = 2000):
  """Centres for bounding circles of `sizes`, inside |p| + a <= max_radius, GAP apart; None
  when they do not fit."""
  out: list[np.ndarray] = []
  for a in sizes:
    for _ in range(tries):
      r = math.sqrt(rng.random()) * (max_radius - a)
      t = rng.uniform(0, 2 * math.pi)
      c = np.array([r * math.cos(t), r * math.sin(t)])
      if all(np.hypot(*(c - o)) >= a + b + GAP for o, b in zip(out, sizes)):
        out.append(c)
        break
    else:
      return None
  return out


def draw_target(rng: np.random.Generator, family: str, group: str, spec) -> Target:
  """One target of `family` in `group` (`GROUPS`), contrasts from `spec` (a PhantomSpec)."""
  if family not in FAMILIES or group not in GROUPS:
    raise InputError(
      f"held-out family {family!r} in {group!r}: one of {FAMILIES} in {list(GROUPS)}"
    )
  lo, hi, both = GROUPS[group]
  n = int(rng.integers(max(lo, 2) if family == "touching" else lo, hi + 1))
  signs = _signs(rng, n, both)
  con, res = (spec.v_min, spec.v_max), spec.resistive_range()
  v = tuple(float(s * rng.uniform(*(con if s > 0 else res))) for s in signs)
  while True:
    if family == "touching":  # pairs in contact: each pair one bounding circle
      pairs = (n + 1) // 2
      sizes = rng.uniform(0.3, 0.45, pairs)
      centres = _places(rng, sizes, spec.max_radius)
      if centres is None:
        continue
      shapes = []
      for c, big in zip(centres, sizes):
        t = rng.uniform(0, 2 * math.pi)
        u = np.array([math.cos(t), math.sin(t)])
        r1 = rng.uniform(0.4, 0.55) * big
        r2 = big - r1
        shapes.append(_ellipse(c - r2 * u, r1, r1 * rng.uniform(0.7, 1.0), t))
        shapes.append(_ellipse(c + (r1 - TOUCH) * u, r2 + TOUCH / 2, r2, t))
      return Target(family, tuple(shapes[:n]), v)
    sizes = rng.uniform(spec.min_size, spec.max_size, n) if n == 1 else rng.uniform(*MANY_SIZE, n)
    centres = _places(rng, sizes, spec.max_radius)
    if centres is not None:
      make = MAKERS[family]
      return Target(family, tuple(make(rng, c, a) for c, a in zip(centres, sizes)), v)


def label_image(target: Target, size: int = 128, supersample: int = 4) -> np.ndarray:
  """(size, size) float32: each pixel's area fraction times its object's v."""
  from cdeit_jax.eit import phantom

  pts = phantom.pixel_centres(size, supersample)
  return target.label(pts).mean(-1).astype(np.float32)


def conductivity(target: Target, sample_points: np.ndarray, sigma_bg: float) -> np.ndarray:
  """(E,) the elements' conductivity: sigma_bg * 10^label averaged over each one's sample points
  (E, S, 2), as `eit.phantom.element_conductivity` for the generator's phantoms."""
  return sigma_bg * np.mean(10.0 ** target.label(np.asarray(sample_points, np.float64)), -1)


def make(sim_cfg, group: str, num: int, seed: int = 0) -> dict:
  """`num` targets of `group` from the simulator config `sim_cfg` (`config.simulator`):
  {"ys": (num, R) float32 difference voltages, "xs": (num, 128, 128) label images, "families",
  "objects", "classes" per target (classes: conductive, resistive counts)}."""
  import jax
  import jax.numpy as jnp

  from cdeit_jax.data import synthetic

  gen = synthetic.generator(sim_cfg)
  sim, spec = gen.sim, gen.spec
  rng = np.random.default_rng([SEED_OFFSET, seed, list(GROUPS).index(group)])
  targets = [draw_target(rng, FAMILIES[i % len(FAMILIES)], group, spec) for i in range(num)]
  points = np.asarray(sim.sample_points, np.float64)
  sigma = np.stack([conductivity(t, points, sim.sigma_bg) for t in targets]).astype(np.float32)
  base = jax.random.fold_in(jax.random.key(SEED_OFFSET + seed), list(GROUPS).index(group))
  keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num))

  def measure(s, k):
    noise = None if gen.snr_db is None else jax.vmap(lambda x: jax.random.fold_in(x, 1))(k)
    if gen.nominal:
      return sim.difference(s, gen.snr_db, noise)
    return sim.system_difference(s, gen.systems(k), gen.snr_db, noise)

  # one target a call: LAPACK's batched kernels may block XLA:CPU's pool (synthetic.per_example)
  one = jax.jit(lambda s, k: measure(s[None], k[None])[0])
  ys = np.stack([np.asarray(one(sigma[i], keys[i])) for i in range(num)])
  return {
    "ys": ys.astype(np.float32),
    "xs": np.stack([label_image(t) for t in targets]),
    "families": [t.family for t in targets],
    "objects": [len(t.shapes) for t in targets],
    "classes": [[int(sum(v > 0 for v in t.v)), int(sum(v < 0 for v in t.v))] for t in targets],
  }


def write_set(out: str, sim_cfg, num: int, seed: int, config: str) -> None:
  """`make`'s targets of every group, `num` each, written as `out`/GROUP/NNNNNNN.npz and
  `out`/RECORD (naming `config`): made whole beside `out`, then put in place of a set made before,
  the record last."""
  record = {"config": config, "seed": seed, "num": num, "groups": {}}
  stage = f"{out}.partial"  # the new set, made whole beside the old one, then put in its place
  fileio.remove_tree(stage)
  for group in GROUPS:
    t0 = time.perf_counter()
    made = make(sim_cfg, group, num, seed)
    folder = fileio.join(stage, group)
    fileio.makedirs(folder)
    for i, (ys, xs) in enumerate(zip(made["ys"], made["xs"])):
      arrays = {"ys": ys[:, None], "xs": xs}
      fileio.atomic_write(
        fileio.join(folder, file_name(i)), functools.partial(savez, arrays=arrays)
      )
    record["groups"][group] = {k: made[k] for k in ("families", "objects", "classes")}
    took = time.perf_counter() - t0
    logs.log.info(f"{fileio.join(out, group)}: {num} targets in {took:.0f} s")
  fileio.write_text(fileio.join(stage, RECORD), json.dumps(record, indent=1))
  # a set made before (another --num or seed) is replaced whole: no target of it stays
  for group in GROUPS:
    fileio.remove_tree(fileio.join(out, group))
    fileio.move(fileio.join(stage, group), fileio.join(out, group))
  fileio.move(fileio.join(stage, RECORD), fileio.join(out, RECORD))  # the record last
  fileio.remove_tree(stage)
