"""Per-pixel intervals that cover what they say: split-conformal scales of a sampler's std.

A model's K samples give a per-pixel std s; the interval at coverage level a is the prediction
+- c_a s. `fit` takes c_a as the conformal quantile of |pred - gt| / s over a calibration split's
pixels inside the disk (the ceil((n + 1) a)-th smallest of n: Narnhofer et al., arXiv
2212.12499; Teneggi et al., K-RCPS, ICML 2023), one scale per level, so the interval covers the
stated fraction of the pixels of held-out images of the same distribution whatever the errors'
tails: "1 and 2 std" are the levels 68.3 % and 95.4 % (a Gaussian's), a user may fit more
(`--config.eval.interval_levels`). The offered std is s times the 1-std scale. Under a shift (a
real tank, another system) the coverage is what it is: eval.py reports it on every set.

A calibration record (a step folder's `uncertainty.json`, `run_opening.UNCERTAINTY_FILE`; a
model file's `uncertainty`) keeps `scales` {level: c} and, for readers of one factor, `scale` (the
1-std one). A record of `scale` alone (one factor fitted as before) reads as a Gaussian's: c_a =
scale times the level's normal quantile (1 and 2 at 1 and 2 std).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError

ONE_SIGMA = 0.6826894921370859  # P(|N(0, 1)| <= 1)
TWO_SIGMA = 0.9544997361036416  # P(|N(0, 1)| <= 2)
LEVELS = (ONE_SIGMA, TWO_SIGMA)  # "1 and 2 std": fitted and reported always
_GAUSSIAN = {ONE_SIGMA: 1.0, TWO_SIGMA: 2.0}  # the normal quantiles of the two, exactly


def _refit(path: str, why: str) -> InputError:
  return InputError(
    f"{path}: {why}; delete the file (the std is then uncalibrated) or fit it again with "
    "--config.eval.fit_uncertainty=True"
  )


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The scales of a std per coverage level: `scales` {level: c} (split-conformal), or one
  Gaussian factor `gaussian` (a record of one scale, or none: 1) for every level."""

  scales: dict[float, float] = dataclasses.field(default_factory=dict)
  gaussian: float | None = None

  @classmethod
  def of_scale(cls, scale: float) -> Calibration:
    return cls(gaussian=float(scale))

  @property
  def method(self) -> str:
    return "gaussian" if self.gaussian is not None else "split-conformal"

  @property
  def levels(self) -> tuple[float, ...]:
    """The levels this calibration states an interval for (a Gaussian's: the two of std)."""
    return tuple(sorted(self.scales)) if self.gaussian is None else LEVELS

  def scale(self, level: float) -> float:
    """c_level: the interval at `level` is +- c_level std."""
    if self.gaussian is not None:
      from scipy import stats

      z = _GAUSSIAN.get(level)
      return self.gaussian * (float(stats.norm.ppf((1 + level) / 2)) if z is None else z)
    if level not in self.scales:
      raise InputError(
        f"coverage level {level}: this calibration holds {', '.join(map(str, self.levels))}; "
        "fit it again with --config.eval.interval_levels including it"
      )
    return self.scales[level]

  @property
  def std_scale(self) -> float:
    """The 1-std scale: the offered std is the raw std times it."""
    return self.scale(ONE_SIGMA)

  def record(self) -> dict:
    """The record's calibration fields (`read` reads them back)."""
    if self.gaussian is not None:
      return {"scale": self.gaussian}
    return {
      "method": self.method,
      "scale": self.std_scale,
      "scale_2std": self.scale(TWO_SIGMA),
      "scales": {repr(k): v for k, v in sorted(self.scales.items())},
    }


UNCALIBRATED = Calibration.of_scale(1.0)


MAX_SCALE = 1e6  # a std scaled by more is no calibration (a fit's scales are of order 1-10)


def from_record(record, where: str) -> Calibration:
  """The calibration of a record (dict) read from `where` (named in errors): its scales numbers
  (not true/false, not text) in (0, MAX_SCALE], growing with the coverage level (a wider
  interval covers more: the 2-std scale is not below the 1-std one)."""
  positive = lambda v: (
    isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_SCALE
  )
  scale = record.get("scale") if isinstance(record, dict) else None
  if not positive(scale):
    raise _refit(where, f"'scale' must be a positive number up to {MAX_SCALE:g}, got {scale!r}")
  if "scales" not in record:
    return Calibration.of_scale(float(scale))
  try:
    scales = {float(k): v for k, v in record["scales"].items()}
  except (AttributeError, TypeError, ValueError):
    raise _refit(where, "'scales' must map coverage levels to scales") from None
  bad = {k: v for k, v in scales.items() if not (0 < k < 1 and positive(v))}
  if bad or ONE_SIGMA not in scales or TWO_SIGMA not in scales:
    raise _refit(
      where,
      f"'scales' must hold positive scales up to {MAX_SCALE:g} at levels {LEVELS} and in (0, 1)",
    )
  ordered = [scales[k] for k in sorted(scales)]
  if any(b < a for a, b in zip(ordered, ordered[1:])):
    raise _refit(where, "'scales' must grow with the level (the 2-std scale not below the 1-std)")
  return Calibration({k: float(v) for k, v in scales.items()})


def read(path: str) -> Calibration:
  """The calibration kept at `path` (a step folder's uncertainty.json); uncalibrated (scale 1)
  if there is none."""
  text = fileio.read_text(path)
  if text is None:
    return UNCALIBRATED
  try:
    record = json.loads(text)
  except ValueError as e:
    raise _refit(path, f"unreadable ({e})") from None
  return from_record(record, path)


def conformal_quantile(ratios: np.ndarray, level: float) -> float:
  """The split-conformal scale at `level` of calibration scores `ratios` (n,): their
  ceil((n + 1) level)-th smallest (the largest when that passes n)."""
  n = len(ratios)
  k = min(n, math.ceil((n + 1) * level))
  return float(np.partition(ratios, k - 1)[k - 1])


def fit(ratios: np.ndarray, levels=()) -> Calibration:
  """The split-conformal calibration at `LEVELS` and `levels` of the scores |pred - gt| / std."""
  wanted = sorted({*LEVELS, *(float(v) for v in levels)})
  bad = [v for v in wanted if not 0 < v < 1]
  if bad:
    raise InputError(f"--config.eval.interval_levels: coverage levels lie in (0, 1), got {bad}")
  return Calibration({v: conformal_quantile(ratios, v) for v in wanted})


class Coverage:
  """How honest a per-pixel std is, images given a chunk at a time: the fraction of the disk's
  pixels whose |pred - gt| lies within each calibrated interval (and within 1 and 2 raw stds),
  and the correlation over images of an image's mean std and its RMSE. With `calibration=None`
  it keeps every pixel's score |pred - gt| / std (8 bytes a pixel) to `fit` one first."""

  def __init__(self, calibration: Calibration | None = UNCALIBRATED):
    self.calibration = calibration
    self._factors = () if calibration is None else self._factors_of(calibration)
    self._within = np.zeros(len(self._factors))
    self._pixels = 0
    self._ratios: list[np.ndarray] = []
    self._image_std: list[float] = []
    self._image_rmse: list[float] = []
    self._std_sum = 0.0

  @staticmethod
  def _factors_of(calibration: Calibration) -> tuple[float, ...]:
    return (*(calibration.scale(v) for v in calibration.levels), 1.0, 2.0)

  def add(self, pred: np.ndarray, std: np.ndarray, gt: np.ndarray) -> None:
    """Images (n, H, W) each."""
    from cdeit_jax.eit.phantom import disk_mask

    disk = disk_mask(np.shape(gt)[-1])
    err = np.abs(np.asarray(pred, np.float64) - gt)[:, disk]
    sd = np.asarray(std, np.float64)[:, disk]
    if self.calibration is None:
      self._ratios.append(
        np.where(sd > 0, err / np.maximum(sd, 1e-12), np.where(err > 0, np.inf, 0.0)).ravel()
      )
    for i, c in enumerate(self._factors):
      self._within[i] += np.count_nonzero(err <= c * sd)
    self._pixels += err.size
    self._image_std += sd.mean(1).tolist()
    self._image_rmse += np.sqrt((err * err).mean(1)).tolist()
    self._std_sum += float(sd.sum())

  def fit(self, levels=()) -> Calibration:
    """The split-conformal calibration (`fit`) of the scores kept (built with None)."""
    if self.calibration is not None:
      raise ValueError("Coverage.fit needs Coverage(calibration=None)")
    return fit(np.concatenate(self._ratios), levels)

  def result(self, calibration: Calibration | None = None) -> dict:
    """The coverage at the calibration given when built (or, built with None, `calibration`)."""
    from cdeit_jax.infer.metrics import pearson

    if self.calibration is None:
      calibration = calibration or UNCALIBRATED
      ratios = np.concatenate(self._ratios)
      within = [np.count_nonzero(ratios <= c) for c in self._factors_of(calibration)]
    else:
      calibration, within = self.calibration, self._within
    cover = [float(w / self._pixels) for w in within]
    levels = calibration.levels
    by_level = dict(zip(levels, cover))
    n = len(self._image_std)
    scale = calibration.std_scale
    return {
      "scale": float(scale),
      "scale_2std": float(calibration.scale(TWO_SIGMA)),
      "calibration": calibration.method,
      "coverage_1std": by_level[ONE_SIGMA],
      "coverage_2std": by_level[TWO_SIGMA],
      "coverage": {repr(v): c for v, c in by_level.items()},
      "raw_coverage_1std": cover[len(levels)],
      "raw_coverage_2std": cover[len(levels) + 1],
      "std_error_cc": pearson(np.asarray(self._image_std), np.asarray(self._image_rmse))
      if n > 1
      else float("nan"),
      "mean_std": float(scale * self._std_sum / self._pixels),
    }


def coverage(pred: np.ndarray, std: np.ndarray, gt: np.ndarray, calibration=UNCALIBRATED) -> dict:
  """`Coverage.result` of images (N, H, W)."""
  c = Coverage(calibration)
  c.add(pred, std, gt)
  return c.result()


def fit_images(pred: np.ndarray, std: np.ndarray, gt: np.ndarray, levels=()) -> Calibration:
  """`Coverage.fit` of images (N, H, W)."""
  c = Coverage(None)
  c.add(pred, std, gt)
  return c.fit(levels)
