"""The Sciospec recording's images judged (docs/your_device.md, "Sciospec"): no ground truth exists,
so what the images must show is measured, and printed as JSON:

  python -m cdeit_jax.sciospec_check --recording "RECORDING" --images OUT [--figures docs]

RECORDING: the recording folder; OUT: the folder of `python -m cdeit_jax.reconstruct --frames
RECORDING --reference RECORDING --out OUT`. A frame's voltage change is the relative change
||v - v_ref|| / ||v_ref|| of the 208 pairs that touch no injecting electrode (the model's).
Empty frames: those changing by under 0.2 %, less the reference's; object frames: over 3 %.
Printed: the image count; the empty frames' RMS over the object frames' median RMS; the share of
object frames imaged resistive (minimum <= -0.3 and |minimum| > maximum); the object's centroid
(of the pixels under half the minimum) and its median jump between consecutive object frames, in
tank radii. The settings of `common.sciospec` (the environment's) must be the reconstruction's.
`--figures DIR` writes DIR/sciospec_frames.png and DIR/sciospec_track.png.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import flags

from cdeit_jax.common import sciospec
from cdeit_jax.eit.phantom import disk_mask

FLAGS = flags.FLAGS


def voltage_change(recording: str) -> tuple[np.ndarray, np.ndarray, str]:
  """(each frame's relative change on the 208 non-touching pairs, the reference rows, name)."""
  d = sciospec.read(recording)
  f, ref = d["frames"], d[sciospec.EMPTY]
  p = d[sciospec.CURRENTS].shape[1]
  m = len(f[0]) // p
  inj = np.argmax(d[sciospec.CURRENTS], 0), np.argmin(d[sciospec.CURRENTS], 0)
  plus, minus = np.argmax(d[sciospec.PAIRS], 0), np.argmin(d[sciospec.PAIRS], 0)
  far = np.array(
    [[not {plus[j], minus[j]} & {inj[0][k], inj[1][k]} for j in range(m)] for k in range(p)]
  )
  far = far.reshape(-1)
  change = np.linalg.norm((f - ref)[:, far], axis=1) / np.linalg.norm(ref[far])
  name, rows = str(d[sciospec.NAME]), d[sciospec.EMPTY_ROWS]
  return change, rows, name


def centroids(images: np.ndarray) -> np.ndarray:
  """(N, 2): x, y (tank radii) of the pixels under half of each image's minimum."""
  size = images.shape[-1]
  c = (np.arange(size) - (size - 1) / 2) / (size / 2)
  x, y = np.meshgrid(c, c)  # row index grows with +y (origin="lower")
  out = np.full((len(images), 2), np.nan)
  for i, img in enumerate(images):
    w = np.where(img < 0.5 * img.min(), -img, 0.0)
    if img.min() < 0 and w.sum() > 0:
      out[i] = (w * x).sum() / w.sum(), (w * y).sum() / w.sum()
  return out


def main(argv: list[str]) -> None:
  del argv
  print(json.dumps(check(FLAGS.recording, FLAGS.images, FLAGS.figures), indent=1))


def check(recording: str, out: str, figures_folder: str | None = None) -> dict:
  """The figures of the images in `out` of `recording` (module docstring); the PNGs written into
  `figures_folder` when one is given."""
  from cdeit_jax.common.errors import MissingFile

  path = os.path.join(out, "frames.npz")
  if not os.path.isfile(path):
    raise MissingFile(f"--images {out}: no frames.npz (python -m cdeit_jax.reconstruct --out)")
  images = np.load(path)["images"]
  change, ref_rows, name = voltage_change(recording)
  mask = disk_mask(images.shape[-1])
  rms = np.sqrt(np.nanmean(images[:, mask] ** 2, axis=1))
  lows, highs = images[:, mask].min(1), images[:, mask].max(1)
  empty = np.setdiff1d(np.flatnonzero(change < 0.002), ref_rows)
  obj = np.flatnonzero(change > 0.03)
  resistive = (lows[obj] <= -0.3) & (-lows[obj] > highs[obj])
  cen = centroids(images)
  consecutive = obj[1:][np.diff(obj) == 1]
  jumps = np.linalg.norm(cen[consecutive] - cen[consecutive - 1], axis=1)
  report = {
    "device": name,
    "images": int(len(images)),
    "frames": int(len(change)),
    "reference_rows": [int(ref_rows[0]), int(ref_rows[-1])],
    "empty_frames": [int(empty.min()), int(empty.max()), int(len(empty))] if len(empty) else [],
    "object_frames": [int(obj.min()), int(obj.max()), int(len(obj))] if len(obj) else [],
    "empty_rms_max": float(rms[empty].max()),
    "empty_rms_median": float(np.median(rms[empty])),
    "object_rms_median": float(np.median(rms[obj])),
    "empty_over_object_rms": float(rms[empty].max() / np.median(rms[obj])),
    "resistive_share": float(resistive.mean()),
    "median_centroid_jump_radii": float(np.median(jumps)),
    "max_centroid_jump_radii": float(np.max(jumps)),
  }
  if figures_folder:
    from cdeit_jax.common import fileio

    fileio.makedirs(figures_folder)  # as reconstruct makes its --out
    figures(figures_folder, images, change, rms, cen, obj, ref_rows)
  return report


def figures(folder, images, change, rms, cen, obj, ref_rows) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  shown = [10, 40, 70, 100, 130, 160, 190, 215]
  limit = float(np.percentile(np.abs(images[obj][:, disk_mask(images.shape[-1])]), 99.5))
  fig, axes = plt.subplots(1, len(shown), figsize=(1.45 * len(shown) + 0.9, 1.75))
  for ax, i in zip(axes, shown):
    img = np.ma.masked_where(~disk_mask(images.shape[-1]), images[i])
    im = ax.imshow(img, origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit)
    ax.set_title(f"frame {i + 1}" + (" (empty)" if change[i] < 0.002 else ""), fontsize=8)
    ax.set_axis_off()
  fig.colorbar(im, ax=axes.tolist(), fraction=0.02, pad=0.01, label="conductivity change")
  _save(fig, os.path.join(folder, "sciospec_frames.png"), bbox_inches="tight")
  plt.close(fig)

  fig, (left, right) = plt.subplots(
    1, 2, figsize=(7.6, 3.2), gridspec_kw={"width_ratios": [1, 1.5]}
  )
  t = np.linspace(0, 2 * np.pi, 200)
  left.plot(np.cos(t), np.sin(t), "k", lw=0.8)
  for k in range(16):  # electrode 1 on top, numbered clockwise (the reader's default)
    ang = np.pi / 2 - 2 * np.pi * k / 16
    left.plot(np.cos(ang), np.sin(ang), "ks", ms=3)
  left.text(0, 1.08, "1", ha="center", fontsize=7)
  sc = left.scatter(cen[obj, 0], cen[obj, 1], c=obj + 1, cmap="viridis", s=8)
  left.plot(cen[obj, 0], cen[obj, 1], "-", color="0.6", lw=0.5, zorder=0)
  left.set_aspect("equal")
  left.set_axis_off()
  fig.colorbar(sc, ax=left, fraction=0.046, pad=0.02, label="frame")
  left.set_title("the object's centroid", fontsize=9)
  frames = np.arange(1, len(change) + 1)
  right.plot(frames, 100 * change, color="C0", label="voltage change (%)")
  right.axvspan(ref_rows[0] + 1, ref_rows[-1] + 1, color="0.85", label="reference frames")
  right.set_xlabel("frame")
  right.set_ylabel("voltage change (%)", color="C0")
  twin = right.twinx()
  twin.plot(frames, rms, color="C3", lw=0.8)
  twin.set_ylabel("image RMS", color="C3")
  right.legend(loc="upper left", fontsize=7)
  fig.tight_layout()
  _save(fig, os.path.join(folder, "sciospec_track.png"))
  plt.close(fig)


def _save(fig, path: str, **kw) -> None:
  """A figure as a PNG, published whole (`fileio.atomic_write`)."""
  from cdeit_jax.common import fileio

  fileio.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=72, **kw))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("recording", None, "the Sciospec recording folder")
  flags.DEFINE_string("images", None, "python -m cdeit_jax.reconstruct's --out of its frames")
  flags.DEFINE_string("figures", None, "a folder for sciospec_frames.png and sciospec_track.png")
  flags.mark_flags_as_required(["recording", "images"])
  cli.run(main)
