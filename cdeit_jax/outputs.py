"""What an evaluation writes: metrics.json (last: it marks a complete evaluation), metrics.csv,
predictions.npz and .mat, and the figure of reconstructions. All are written beside the folder's
earlier outputs first (a hidden staging folder) and replace them only once every one is complete,
so a failed evaluation (a full disk, a kill) leaves the previous one whole."""

from __future__ import annotations

import csv
import errno
import io
import json
import os

import numpy as np

from cdeit_jax import fileio
from cdeit_jax.eit.phantom import disk_mask
from cdeit_jax.errors import InputError


# Everything an evaluation writes into its output folder, metrics.json last: it marks a complete
# evaluation (an output folder never holds one evaluation's figure beside another's metrics).
OUTPUTS = ("reconstructions.png", "predictions.mat", "predictions.npz", "metrics.csv",
           "metrics.json")


def check_out(out: str, data_path: str | None = None) -> None:
  """Fail before any work when `out` cannot take the outputs (a file, read-only, the data folder
  itself, ...)."""
  if data_path is not None and fileio.resolve(out) == fileio.resolve(data_path):
    raise InputError(f"--out {out} is the data folder: the outputs (predictions.npz) would be read "
                     "as a test case by the next evaluation of it; give another folder")
  fileio.writable_folder(out, "--out")


def _json_clean(tree):
  """NaN and infinities as null: metrics.json stays valid JSON."""
  if isinstance(tree, dict):
    return {k: _json_clean(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_json_clean(v) for v in tree]
  if isinstance(tree, (float, np.floating)):
    return float(tree) if np.isfinite(tree) else None
  if isinstance(tree, np.integer):
    return int(tree)
  return tree


def write_outputs(out: str, result: dict, rows: list[dict], names: list[str], pred: np.ndarray,
                  target: np.ndarray, std: np.ndarray | None, samples: np.ndarray,
                  baselines: dict[str, np.ndarray], mat_scale: float, figure: bool) -> None:
  publish(out, lambda staging: _write_all(staging, result, rows, names, pred, target, std,
                                          samples, baselines, mat_scale, figure), OUTPUTS)


def publish(out: str, write_all, known: tuple[str, ...]) -> list[str]:
  """Call write_all(staging) (a fresh hidden folder in `out`; it returns the names it wrote, the
  one that marks a complete set last in `known`), then replace `out`'s earlier outputs (every
  name in `known`) with them: a failure before that leaves the earlier outputs whole and no
  temporary file; a full disk is one line naming `out`. Returns the names written."""
  staging = fileio.join(out, f".staging-{os.getpid()}")
  fileio.makedirs(staging)
  try:
    written = write_all(staging)
  except BaseException as e:
    fileio.remove_tree(staging)  # the previous outputs stay as they were
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      raise fileio.no_space(out) from None
    raise
  # the old marker goes first (the folder is incomplete until the new one lands)
  marker = known[-1]
  for name in (marker, *[n for n in known if n not in written]):
    fileio.path(fileio.join(out, name)).unlink(missing_ok=True)
  for name in sorted(written, key=lambda n: n == marker):
    fileio.move(fileio.join(staging, name), fileio.join(out, name))
  fileio.remove_tree(staging)
  return written


def _write_all(out: str, result: dict, rows: list[dict], names: list[str], pred: np.ndarray,
               target: np.ndarray, std: np.ndarray | None, samples: np.ndarray,
               baselines: dict[str, np.ndarray], mat_scale: float, figure: bool) -> list[str]:
  """Write every output into `out` (a fresh folder); returns their names."""
  import scipy.io

  def write_csv(p):
    with open(p, "w", newline="") as fh:
      w = csv.DictWriter(fh, fieldnames=["name", *rows[0].keys()])
      w.writeheader()
      for name, r in zip(names, rows):
        w.writerow({"name": name, **r})

  fileio.atomic_write(fileio.join(out, "metrics.csv"), write_csv)
  arrays = {"pred": pred, "target": target, "names": np.asarray(names)}
  if std is not None:
    arrays.update(std=std, samples=samples)

  def write_npz(p):
    with open(p, "wb") as fh:
      np.savez(fh, **arrays)

  fileio.atomic_write(fileio.join(out, "predictions.npz"), write_npz)
  mat = {"pred": (pred[..., 0] * mat_scale).astype(np.float64),
         "target": target[..., 0].astype(np.float64), "names": np.asarray(names, dtype=object),
         "scale": mat_scale}
  if std is not None:
    mat["std"] = (std[..., 0] * abs(mat_scale)).astype(np.float64)
  fileio.atomic_write(fileio.join(out, "predictions.mat"),
                      lambda p: scipy.io.savemat(p, mat, do_compression=True))
  if figure:
    fileio.atomic_write(fileio.join(out, "reconstructions.png"),
                        lambda p: save_figure(p, names, target, pred, std, baselines))
  fileio.write_text(fileio.join(out, "metrics.json"),
                    json.dumps(_json_clean(result), indent=2, allow_nan=False))
  return [n for n in OUTPUTS if figure or n != "reconstructions.png"]


def save_figure(path: str, names, target, pred, std, baselines, max_rows: int = 32) -> None:
  """Ground truth | reconstruction | uncertainty | baselines per image, electrode 0 on top."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = ["ground truth", "CDEIT", "std (uncertainty)" if std is not None else None,
          *[f"{k} (scaled)" for k in baselines]]
  cols = [c for c in cols if c]
  n = min(len(names), max_rows)
  mask = disk_mask(target.shape[1])
  fig, axes = plt.subplots(n, len(cols), figsize=(2.2 * len(cols) + 0.8, 2.1 * n), squeeze=False)
  for r in range(n):
    panels = [target[r, ..., 0], pred[r, ..., 0]]
    if std is not None:
      panels.append(std[r, ..., 0])
    panels += [b[r] for b in baselines.values()]
    for c, (img, title) in enumerate(zip(panels, cols)):
      ax = axes[r, c]
      shown = np.ma.masked_where(~mask, img)
      is_std = title.startswith("std")
      im = ax.imshow(shown, origin="lower", cmap="viridis" if is_std else "RdBu_r",
                     vmin=0 if is_std else -1, vmax=None if is_std else 1)
      ax.set_xticks([])
      ax.set_yticks([])
      if r == 0:
        ax.set_title(title, fontsize=9)
      if c == 0:
        ax.set_ylabel(names[r], fontsize=8)
      fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80)
  plt.close(fig)
  with open(path, "wb") as fh:
    fh.write(buf.getvalue())
