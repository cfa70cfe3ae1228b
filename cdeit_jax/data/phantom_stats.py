"""The objects of a phantom distribution beside those of real truths: counts, areas and distances
to the wall, measured the one way (`objects` on class maps) for both.

  python -m cdeit_jax.phantom_stats --config configs/ktc2023_model.py \\
      --truths data/ktc2023/levels/level_1 [--num 2000]

prints JSON: the distribution's quantiles of each figure and, for every object of the truths
(`trueN.mat`, 0 water / 1 resistive / 2 conductive), the fraction of drawn objects below it (its
percentile), so a truth outside the distribution shows as 0 or 1.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np

from cdeit_jax.eit.phantom import class_map

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


@dataclasses.dataclass(frozen=True)
class Object:
  """One connected region of one class: its class (1 resistive, 2 conductive), its area as a
  fraction of the tank's, and its gap to the wall (1 - the largest radius it reaches)."""

  cls: int
  area: float
  wall_gap: float


def objects(class_map: np.ndarray) -> list[Object]:
  """The connected regions of each class of a square class map (the tank the inscribed disk;
  pixel centres as in `phantom.pixel_centres`, rows in either order)."""
  import scipy.ndimage

  from cdeit_jax.eit.phantom import pixel_centres

  r = np.hypot(*np.moveaxis(pixel_centres(class_map.shape[0])[:, :, 0], -1, 0))
  disk = float((r <= 1).sum())
  out = []
  for cls in (1, 2):
    lab, k = scipy.ndimage.label(class_map == cls)
    for j in range(1, k + 1):
      m = lab == j
      out.append(Object(cls, float(m.sum() / disk), float(1 - r[m].max())))
  return out


def summary(maps: list[np.ndarray]) -> dict:
  """Per target: object count and classes present; per object: area and wall gap."""
  objs = [objects(m) for m in maps]
  flat = [o for os_ in objs for o in os_]
  return {
    "count": np.array([len(o) for o in objs], float),
    "both_classes": np.array([len({x.cls for x in o}) == 2 for o in objs], float),
    "area": np.array([o.area for o in flat]),
    "wall_gap": np.array([o.wall_gap for o in flat]),
  }


def drawn_maps(phantom_spec, num: int, seed: int = 0, size: int = 128) -> list[np.ndarray]:
  """Class maps of `num` phantoms of the simulator's distribution (`phantom.draw_params`),
  rendered at `size` (supersampled 2 x 2)."""
  import jax

  from cdeit_jax.eit import phantom

  keys = jax.random.split(jax.random.PRNGKey(seed), num)
  params = jax.jit(jax.vmap(lambda k: phantom.draw_params(k, phantom_spec)))(keys)
  render = jax.jit(jax.vmap(lambda p: phantom.render_image(p, supersample=2, size=size)))
  images = np.concatenate([np.asarray(render(params[i : i + 256])) for i in range(0, num, 256)])
  return [class_map(im) for im in images]


def truth_maps(folder: str) -> list[np.ndarray]:
  import scipy.io

  paths = sorted(glob.glob(os.path.join(folder, "true*.mat")))
  return [np.asarray(scipy.io.loadmat(p)["truth"]) for p in paths]


def compare(drawn: dict, truths: dict) -> dict:
  """The drawn distribution's quantiles per figure, and each truth's percentile in it."""
  out = {}
  for name in ("count", "area", "wall_gap"):
    d = np.sort(drawn[name])
    out[name] = {
      "drawn_quantiles": dict(
        zip(map(str, QUANTILES), np.quantile(d, QUANTILES).round(4).tolist())
      ),
      "truths": truths[name].round(4).tolist(),
      "truth_percentiles": (np.searchsorted(d, truths[name]) / len(d)).round(3).tolist(),
    }
  out["both_classes"] = {
    "drawn_fraction": float(drawn["both_classes"].mean()),
    "truths_fraction": float(truths["both_classes"].mean()),
  }
  return out
