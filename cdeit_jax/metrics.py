"""Image metrics of CDEIT evaluation (numpy, on the host).

RMSE and PSNR exactly as the CDEIT authors compute them; SSIM as Wang et al. (2004) with the
standard Gaussian window; Pearson's correlation coefficient. Images are on the [-1, 1] scale.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

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
                "reconstruction (cdeit_jax.eit.reconstruct) of ys / voltage_ratio",
    "uncertainty": "K > 1 samples: std over the samples, times the checkpoint's uncertainty "
                   "scale (fitted on simulations, eval.py --config.eval.fit_uncertainty=True; 1 "
                   "when none was fitted). coverage_1std / coverage_2std: the fraction of the "
                   "pixels inside the disk whose |pred - gt| <= 1 / 2 scaled stds (a calibrated "
                   "Gaussian: 0.683 / 0.954); raw_*: the same with the unscaled std; "
                   "std_error_cc: Pearson correlation over images between an image's mean std "
                   "in the disk and its RMSE",
    "baseline_scaling": "classical reconstructions (tikhonov, TR, xs_gn) are divided by their maximum "
                        "absolute value per image (to [-1, 1], not using the ground truth) "
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


def ssim_map(pred: np.ndarray, gt: np.ndarray, sigma: float = 1.5, k1: float = 0.01,
             k2: float = 0.03, data_range: float = 1.0) -> np.ndarray:
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


def per_image(pred: np.ndarray, gt: np.ndarray) -> dict[str, float]:
  return {"rmse": rmse(pred, gt), "psnr": psnr(pred, gt), "ssim": ssim(pred, gt),
          "ssim_disk": ssim_disk(pred, gt), "cc": pearson(pred, gt)}


def _nanmean(values) -> float:
  values = np.asarray(values, np.float64)
  return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def summary(preds: np.ndarray, gts: np.ndarray) -> tuple[dict[str, float], list[dict[str, float]]]:
  """(overall, per-image rows) for stacks of images (N, H, W[, 1])."""
  rows = [per_image(p, g) for p, g in zip(preds, gts)]
  overall = {"rmse": rmse(preds, gts),
             "psnr": float(np.mean([r["psnr"] for r in rows])),
             "ssim": float(np.mean([r["ssim"] for r in rows])),
             "ssim_disk": float(np.mean([r["ssim_disk"] for r in rows])),
             "cc": _nanmean([r["cc"] for r in rows])}
  return overall, rows


def score(pred: np.ndarray, target: np.ndarray, baselines: dict[str, np.ndarray]
          ) -> tuple[dict[str, dict], list[dict[str, float]], dict[str, np.ndarray]]:
  """An evaluation's scores: (overall metrics of CDEIT, the empty image and each baseline that is
  finite everywhere (scaled, `scale_baseline`); per-image rows with the baselines' columns; the
  scaled baselines). `pred`, `target` (n, H, W); `baselines` {name: (n, H, W)}."""
  overall, rows = summary(pred, target)
  empty = summary(np.zeros_like(pred), target)[0]
  report = {"cdeit": overall, "empty": {k: v for k, v in empty.items() if k != "cc"}}  # CC: undefined
  scaled_all = {}
  for name, imgs in baselines.items():
    if np.all(np.isfinite(imgs)):
      scaled = np.stack([scale_baseline(b) for b in imgs])
      scaled_all[name] = scaled
      b_overall, b_rows = summary(scaled, target)
      report[name] = b_overall
      for r, br in zip(rows, b_rows):
        r.update({f"{name}_{m}": v for m, v in br.items()})
  return report, rows, scaled_all


ONE_SIGMA = 0.6826894921370859  # P(|N(0, 1)| <= 1)


def uncertainty(pred: np.ndarray, std: np.ndarray, gt: np.ndarray, scale: float = 1.0
                ) -> dict[str, float]:
  """How honest the per-pixel std is (`DEFINITIONS["uncertainty"]`), images (N, H, W)."""
  from cdeit_jax.eit.phantom import disk_mask
  disk = disk_mask(np.shape(gt)[-1])
  err = np.abs(np.asarray(pred, np.float64) - gt)[:, disk]
  sd = np.asarray(std, np.float64)[:, disk]
  cover = lambda k, c: float(np.mean(err <= k * c * sd))
  per_image_std = sd.mean(1)
  per_image_rmse = np.sqrt((err * err).mean(1))
  return {"scale": float(scale),
          "coverage_1std": cover(1, scale), "coverage_2std": cover(2, scale),
          "raw_coverage_1std": cover(1, 1.0), "raw_coverage_2std": cover(2, 1.0),
          "std_error_cc": pearson(per_image_std, per_image_rmse) if len(err) > 1 else
          float("nan"),
          "mean_std": float(scale * sd.mean())}


def fit_uncertainty_scale(pred: np.ndarray, std: np.ndarray, gt: np.ndarray) -> float:
  """The one factor c that makes c * std cover 68.3 % of the disk's pixel errors (the 1-sigma
  coverage of a Gaussian): the 68.3 % quantile of |pred - gt| / std."""
  from cdeit_jax.eit.phantom import disk_mask
  disk = disk_mask(np.shape(gt)[-1])
  err = np.abs(np.asarray(pred, np.float64) - gt)[:, disk]
  sd = np.asarray(std, np.float64)[:, disk]
  ratio = np.where(sd > 0, err / np.maximum(sd, 1e-12), np.where(err > 0, np.inf, 0.0))
  return float(np.quantile(ratio, ONE_SIGMA))
