"""The figures of merit of CDEIT evaluation (numpy, on the host), and their one registry.

RMSE and PSNR exactly as the CDEIT authors compute them; SSIM as Wang et al. (2004) with the
standard Gaussian window; Pearson's correlation coefficient (images on the [-1, 1] scale); the
GREIT figures of images of small targets (`greit_merit`). `IMAGE` and `GREIT` are the registry
(`Figure`: name, label, function, which way is better, whether the empty image has it): eval.py,
`report` and the GREIT test read them, so a new figure is one entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from scipy import ndimage

from cdeit_jax.infer import greit_merit

DEFINITIONS = {
  "rmse": "sqrt(mean((pred - gt)^2)) over all pixels of all images, on the [-1, 1] scale "
  "(the authors' RMSE); per image the same over its pixels",
  "psnr": "per image, both mapped to [0, 1] by v/2 + 0.5: 10 log10(max(gt)^2 / (mean((gt - "
  "pred)^2) + 1e-12)), averaged over images (the authors' PSNR)",
  "ssim": "Wang et al. 2004 on the [0, 1]-mapped images: Gaussian window sigma 1.5 (11 x 11, "
  "truncate 3.5), K1 0.01, K2 0.03, data range 1, population covariances, mean over the "
  "image without the 5-pixel border (scikit-image's gaussian_weights=True convention)",
  "ssim_disk": "the same SSIM map averaged over the pixels inside the disk (the imaged domain) "
  "only: the empty background outside it does not count",
  "cc": "Pearson correlation coefficient between pred and gt pixels, per image (NaN if either "
  "is constant), averaged over images",
  "empty": "the empty image (all zeros, no change): the floor every method must beat",
  "tikhonov": "eval.py --config.eval.tikhonov=True: the built-in one-step Tikhonov/NOSER "
  "reconstruction (cdeit_jax.eit.tikhonov) of ys / voltage_ratio",
  "uncertainty": "K > 1 samples: std over the samples; the interval at a coverage level is "
  "the std times the calibration's scale for that level (infer.intervals: split-conformal, "
  "the level's quantile of |pred - gt| / std over a calibration split's disk pixels, eval.py "
  "--config.eval.fit_uncertainty=True; a calibration of one scale s, as fitted before, reads as "
  "a Gaussian's: s times the level's normal quantile; none: scale 1 at 1 std). `scale` is the "
  "1-std scale (the offered std is the raw std times it), `scale_2std` the 2-std one. "
  "coverage_1std / coverage_2std: the fraction of the pixels inside the disk whose |pred - gt| "
  "lies within the 1 / 2 std intervals (stated: 0.683 / 0.954); coverage: the same at each "
  "level the calibration holds; raw_*: within 1 / 2 unscaled stds; std_error_cc: Pearson "
  "correlation over images between an image's mean std in the disk and its RMSE",
  "greit": "eval.py --config.eval.greit=True: the GREIT linear reconstruction (cdeit_jax.eit."
  "greit: desired images of radius 0.2, its weight chosen for a noise figure of 0.5) of ys / "
  "voltage_ratio",
  "baseline_scaling": "classical reconstructions (tikhonov, greit, TR, xs_gn) are divided by "
  "their "
  "maximum absolute value per image (to [-1, 1], not using the ground truth) "
  "before the same metrics",
}


def to_unit(v: np.ndarray) -> np.ndarray:
  return np.asarray(v, np.float64) / 2 + 0.5


def rmse(pred: np.ndarray, gt: np.ndarray) -> float:
  d = np.asarray(pred, np.float64) - np.asarray(gt, np.float64)
  return float(np.sqrt(np.mean(d * d)))


def psnr(pred: np.ndarray, gt: np.ndarray) -> float:
  p, g = to_unit(pred), to_unit(gt)
  return float(10 * np.log10(g.max() ** 2 / (np.mean((g - p) ** 2) + 1e-12)))


def ssim_map(
  pred: np.ndarray,
  gt: np.ndarray,
  sigma: float = 1.5,
  k1: float = 0.01,
  k2: float = 0.03,
  data_range: float = 1.0,
) -> np.ndarray:
  """Per-pixel Gaussian-window SSIM of two 2-D images given on [-1, 1] (compared on [0, 1])."""
  x, y = to_unit(np.squeeze(pred)), to_unit(np.squeeze(gt))
  filt = lambda a: ndimage.gaussian_filter(a, sigma, mode="reflect", truncate=3.5)
  mx, my = filt(x), filt(y)
  vx, vy, cxy = filt(x * x) - mx * mx, filt(y * y) - my * my, filt(x * y) - mx * my
  c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
  return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))


def ssim(pred: np.ndarray, gt: np.ndarray, sigma: float = 1.5, **kw) -> float:
  """SSIM over the square without the window's border (the standard figure)."""
  pad = int(3.5 * sigma + 0.5)  # the window's radius
  return float(ssim_map(pred, gt, sigma, **kw)[pad:-pad, pad:-pad].mean())


def ssim_disk(pred: np.ndarray, gt: np.ndarray, **kw) -> float:
  """SSIM averaged over the pixels inside the disk."""
  from cdeit_jax.eit.phantom import disk_mask

  m = ssim_map(pred, gt, **kw)
  return float(m[disk_mask(m.shape[0])].mean())


def pearson(pred: np.ndarray, gt: np.ndarray) -> float:
  p, g = np.ravel(pred).astype(np.float64), np.ravel(gt).astype(np.float64)
  p, g = p - p.mean(), g - g.mean()
  denom = np.sqrt((p * p).sum() * (g * g).sum())
  return float((p * g).sum() / denom) if denom > 0 else float("nan")


def scale_baseline(b: np.ndarray) -> np.ndarray:
  """A classical reconstruction divided by its max |value| (documented in DEFINITIONS)."""
  m = np.nanmax(np.abs(b))
  return b / m if m > 0 else b


@dataclasses.dataclass(frozen=True)
class Figure:
  """One figure of merit (module docstring): its name (metrics.json's key), its label and format
  in tables, its function, which way is better (a key of `BETTER`), whether the empty image has
  it (the CC of a constant image is undefined) and whether the report's verdict counts it. An
  image figure's function takes (pred, gt), and its images combine by `combine` ("mean",
  "nanmean", or "rms": the root of the images' mean squared error); a GREIT figure's takes one
  `greit_merit.TargetImage`, by EIDORS' definition, and `variants` holds other definitions by
  name (pyEIT's); `centre_normalised`: over more than 10 targets it is divided by the mean of the
  targets near the centre (EIDORS' AR)."""

  name: str
  label: str
  fmt: str
  function: Callable
  better: str
  empty: bool = True
  judged: bool = False
  combine: str = "mean"
  variants: dict[str, Callable] = dataclasses.field(default_factory=dict)
  centre_normalised: bool = False

  def is_better(self, a: float, b: float) -> bool:
    """Whether value `a` of this figure is better than `b`."""
    return BETTER[self.better](a, b)


BETTER = {
  "lower": lambda a, b: a < b,
  "higher": lambda a, b: a > b,
  "nearer 0": lambda a, b: abs(a) < abs(b),
  "nearer 1": lambda a, b: abs(a - 1) < abs(b - 1),
}

# An image against its truth: every evaluation's columns, in this order.
IMAGE = (
  Figure("rmse", "RMSE", "{:.4f}", rmse, "lower", judged=True, combine="rms"),
  Figure("psnr", "PSNR", "{:.2f}", psnr, "higher", judged=True),
  Figure("ssim", "SSIM", "{:.3f}", ssim, "higher"),
  Figure("ssim_disk", "SSIM disk", "{:.3f}", ssim_disk, "higher"),
  Figure("cc", "CC", "{:.3f}", pearson, "higher", empty=False, judged=True, combine="nanmean"),
)


def _greit(name: str, fmt: str, better: str, fn: Callable, pyeit: Callable | None = None, **kw):
  """A GREIT figure: EIDORS' `fn`, pyEIT's variant `pyeit` (the same function if None)."""
  return Figure(name, name, fmt, fn, better, False, variants={"pyeit": pyeit or fn}, **kw)


# Images of a small target (the GREIT test, `infer.greit_test`; greit_merit's definitions).
GREIT = (
  _greit("AR", "{:.3f}", "nearer 1", greit_merit.amplitude, greit_merit.pyeit_amplitude,
         centre_normalised=True),
  _greit("PE", "{:+.3f}", "nearer 0", greit_merit.position_error,
         greit_merit.pyeit_position_error),
  _greit("RES", "{:.3f}", "lower", greit_merit.resolution),
  _greit("SD", "{:.3f}", "lower", greit_merit.shape_deformation,
         greit_merit.pyeit_shape_deformation),
  _greit("RNG", "{:.3f}", "lower", greit_merit.ringing),
)  # fmt: skip
FIGURES = {f.name: f for f in IMAGE + GREIT}
HEADLINE = IMAGE[0]  # the figure a method's lead over another is told in (RMSE)


def per_image(pred: np.ndarray, gt: np.ndarray) -> dict[str, float]:
  return {f.name: f.function(pred, gt) for f in IMAGE}


def _nanmean(values) -> float:
  values = np.asarray(values, np.float64)
  return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def summary(preds: np.ndarray, gts: np.ndarray) -> tuple[dict[str, float], list[dict[str, float]]]:
  """(overall, per-image rows) for stacks of images (N, H, W[, 1])."""
  rows = [per_image(p, g) for p, g in zip(preds, gts)]
  return _overall(rows, [_mse(p, g) for p, g in zip(preds, gts)]), rows


def _mse(pred: np.ndarray, gt: np.ndarray) -> float:
  d = np.asarray(pred, np.float64) - np.asarray(gt, np.float64)
  return float(np.mean(d * d))


_COMBINE = {
  "rms": lambda values, mse: float(np.sqrt(np.mean(mse))),
  "mean": lambda values, mse: float(np.mean(values)),
  "nanmean": lambda values, mse: _nanmean(values),
}


def _overall(rows: list[dict[str, float]], mse: list[float]) -> dict[str, float]:
  """The overall figures of per-image rows (each figure's `combine`: RMSE over all pixels, every
  image having as many, from the images' mean squared errors; the others averaged over
  images)."""
  return {f.name: _COMBINE[f.combine]([r[f.name] for r in rows], mse) for f in IMAGE}


def greit_figures(
  images: np.ndarray,
  positions: np.ndarray,
  medium: np.ndarray,
  truths: np.ndarray | None = None,
  definition: str = "eidors",
) -> dict[str, np.ndarray]:
  """{GREIT figure: (N,)} of images (N, H, W) of small targets at `positions` (N, 2, in units of
  the tank's radius) by `definition` ("eidors", or a variant's name: "pyeit"); `truths` (N, H,
  W) the targets' images (pyEIT's PE reads them); a centre-normalised figure of more than 10
  images is divided by the mean of the targets within `greit_merit.CENTRE_RADIUS` of the
  centre (EIDORS' AR)."""
  if definition not in greit_merit.DEFINITIONS:
    raise ValueError(f"definition {definition!r}: one of {greit_merit.DEFINITIONS}")
  targets = [
    greit_merit.read(im, medium, p, None if truths is None else truths[i])
    for i, (im, p) in enumerate(zip(images, positions))
  ]
  out = {}
  centre = np.hypot(*np.asarray(positions, np.float64).T) < greit_merit.CENTRE_RADIUS
  for f in GREIT:
    fn = f.function if definition == "eidors" else f.variants[definition]
    values = np.array([fn(t) for t in targets])
    if definition == "eidors" and f.centre_normalised and len(targets) > 10 and centre.any():
      values = values / values[centre].mean()
    out[f.name] = values
  return out


class Scores:
  """An evaluation's scores, images given a chunk at a time (memory stays flat as the test set
  grows): per-image rows of CDEIT and of each baseline, the empty image's, and the overall
  figures at the end. A baseline that is not finite everywhere is left out (its columns too).
  `score` is this over one chunk."""

  def __init__(self, baselines=()):
    self.rows: list[dict[str, float]] = []
    self._mse: dict[str, list[float]] = {"cdeit": [], "empty": []}
    self._rows: dict[str, list[dict[str, float]]] = {"empty": []}
    self._finite = {name: True for name in baselines}
    for name in baselines:
      self._mse[name], self._rows[name] = [], []

  def add(
    self, pred: np.ndarray, target: np.ndarray, baselines: dict[str, np.ndarray]
  ) -> dict[str, np.ndarray]:
    """Score images (n, H, W) and the baselines' {name: (n, H, W)}; returns the baselines
    scaled (`scale_baseline`) as scored."""
    scaled_all = {}
    for p, g in zip(pred, target):
      self.rows.append(per_image(p, g))
      self._mse["cdeit"].append(_mse(p, g))
      empty = np.zeros_like(p)
      self._rows["empty"].append(per_image(empty, g))
      self._mse["empty"].append(_mse(empty, g))
    for name, imgs in baselines.items():
      self._finite[name] = self._finite[name] and bool(np.all(np.isfinite(imgs)))
      if not self._finite[name]:
        continue
      scaled = np.stack([scale_baseline(b) for b in imgs])
      scaled_all[name] = scaled
      for b, g in zip(scaled, target):
        self._rows[name].append(per_image(b, g))
        self._mse[name].append(_mse(b, g))
    return scaled_all

  def result(self) -> tuple[dict[str, dict], list[dict[str, float]]]:
    """(overall metrics of CDEIT, the empty image and each baseline finite everywhere; per-image
    rows with those baselines' columns)."""
    report = {
      "cdeit": _overall(self.rows, self._mse["cdeit"]),
      "empty": {
        k: v
        for k, v in _overall(self._rows["empty"], self._mse["empty"]).items()
        if FIGURES[k].empty
      },
    }
    rows = [dict(r) for r in self.rows]
    for name, ok in self._finite.items():
      if ok:
        report[name] = _overall(self._rows[name], self._mse[name])
        for r, br in zip(rows, self._rows[name]):
          r.update({f"{name}_{m}": v for m, v in br.items()})
    return report, rows


def score(
  pred: np.ndarray, target: np.ndarray, baselines: dict[str, np.ndarray]
) -> tuple[dict[str, dict], list[dict[str, float]], dict[str, np.ndarray]]:
  """An evaluation's scores: (overall metrics of CDEIT, the empty image and each baseline that is
  finite everywhere (scaled, `scale_baseline`); per-image rows with the baselines' columns; the
  scaled baselines). `pred`, `target` (n, H, W); `baselines` {name: (n, H, W)}."""
  s = Scores(baselines)
  scaled = s.add(pred, target, baselines)
  report, rows = s.result()
  return report, rows, {k: v for k, v in scaled.items() if k in report}
