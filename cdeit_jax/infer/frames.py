"""Voltage frames files in, image sequences out (`python -m cdeit_jax.reconstruct`).

In: `.npy`, `.npz`, `.mat` (MATLAB v4 to v7.3) or `.csv`/`.txt`, frames as rows (N, R) in the
measuring system's order (R = 208 for CDEIT's; columns (R, N), as EIDORS keeps them, are
turned; NaN: a missing value), or the device's own file (any `eit.device_files.DeviceFormat`,
KTC's or UEF's keys: its one frame, `eit.layout.from_device_file`), or a recording that holds
its device, a Sciospec folder (`common.sciospec`: its frames, its empty tank as `empty`, which
--reference takes). Files are read through the one
registry of formats, `common.array_files`, a block of frames at a time (`Recording`). An `.npz`
or `.mat` holds them under `frames` (or `voltages`, or as its only array) and may hold a
reference frame under `reference`. A `.csv` may start with one header line.

Out: `frames.npz` (`images` (N, 128, 128) in label units, `std` for K > 1, `rows`, `skipped`:
row numbers from 0, as Python counts), `frames.mat` (MATLAB v7.3: the same in the device's
conductivity units, `scale`; its `rows` and `skipped` count from 1, as MATLAB does), a PNG montage
and an animated GIF with one fixed colour scale and a colourbar. All are written into a hidden
staging folder and moved into place once complete (`outputs.publish`).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from cdeit_jax.common import array_files, fileio, matfile, streamed_npz
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files, layout
from cdeit_jax.eit.measurement import NUM_MEASUREMENTS
from cdeit_jax.eit.phantom import disk_mask

FRAME_KEYS = ("frames", "voltages", "dv", "ys")
REFERENCE_KEYS = ("reference", "v_ref", "ref")
SUFFIXES = (".npy", ".npz", ".mat", ".csv", ".txt")
OUTPUTS = ("montage.png", "frames.gif", "frames.mat", "frames.npz")  # frames.npz last: complete
# the frames a second a GIF can show: a frame's delay is a 16-bit count of 1/100 s
GIF_FPS = (100 / 65535, 100.0)


class Recording:
  """A frames file of `num_values` values per frame (CDEIT's 208, or the measuring system
  `system`'s; NaN: a missing value), read a block of frames at a time (`rows`), so that memory
  stays flat however long the recording (`common.array_files`: a local .npy or np.savez's .npz
  memory-mapped, a MATLAB v7.3 file from its HDF5 datasets, a .csv by rows; a v5 .mat or a
  compressed .npz whole). `n` frames, the `reference` frame (R,) or None, `has_targets` (the
  true images: an npz's `targets`, as simulated sequences carry), `device` (a device file's own
  measuring system, else None). A bad file is an InputError
  naming it (and the row, where one is at fault). `close` it, or use it in `with`. `negate`:
  the frames and the reference read with the other sign (a device measuring with the opposite
  sign to the model's)."""

  def __init__(
    self,
    path: str,
    num_values: int = NUM_MEASUREMENTS,
    system: str | None = None,
    negate: bool = False,
  ):
    self.path, self.num_values, self.sign = path, num_values, -1.0 if negate else 1.0
    self._arrays = array_files.open(path, SUFFIXES, "frames file")
    try:
      self._open(system)
    except BaseException:
      self._arrays.close()
      raise

  def _open(self, system: str | None) -> None:
    path, m, arrays = self.path, self.num_values, self._arrays
    if array_files.SINGLE in arrays:  # a format of one array: the frames
      arrays = {"frames": arrays[array_files.SINGLE]}
    self.device = None  # a device file's own measuring system (`frame_guards.check_source`)
    # a recording that holds its device and its empty tank (a Sciospec folder): its frames, and
    # the empty tank as `empty` (what --reference takes of it); `empty_where`: which frames
    self.empty, self.empty_where = None, None
    if device_files.device_format(arrays) is not None:  # the device's own file: its one frame
      self.device, frame = layout.from_device_file(path)
      if frame is None:
        raise InputError(f"{path}: a device file without a frame (its values, e.g. Uel)")
      if FRAME_KEYS[0] in arrays:
        self.empty, self.empty_where = self.sign * frame, self.device.name
      else:
        arrays = {"frames": frame[None]}
    a = _pick(path, arrays, FRAME_KEYS, required=True)
    _numeric(path, a, "the frames")
    if isinstance(a, array_files.TextTable):
      _text_shape(path, a, m)
    if a.ndim == 1 and a.shape[0] == m:
      a = np.asarray(a)[None]
    # (R, R): rows or columns cannot be told by the shape; read as rows (`square` says so)
    self.square = a.ndim == 2 and a.shape == (m, m)
    if a.ndim == 2 and a.shape[1] != m and a.shape[0] == m:
      self._frames, self.n = (lambda lo, hi: a[:, lo:hi].T), a.shape[1]  # columns (EIDORS)
    elif a.ndim == 2 and a.shape[1] == m:
      self._frames, self.n = (lambda lo, hi: a[lo:hi]), a.shape[0]
    else:
      raise layout.frames_shape_error(path, a.shape, m, system)
    if self.n == 0:
      raise InputError(f"{path}: no frames (0 rows of {m} voltages)")
    reference = _pick(path, arrays, REFERENCE_KEYS, required=False)
    if reference is not None:
      reference = np.asarray(reference)
      if reference.size != m:
        raise InputError(
          f"{path}: the reference frame must hold {m} voltages, got shape {reference.shape}"
        )
      reference = _numeric(path, reference, "the reference frame").astype(np.float64).reshape(m)
      reference = self.sign * reference
    self.reference = reference
    targets = arrays.get("targets")
    if targets is not None:
      square = targets.ndim == 3 and targets.shape[1] == targets.shape[2]
      if targets.shape[:1] != (self.n,) or not square:
        raise InputError(
          f"{path}: 'targets' (the true images) must be (N, size, size) for its "
          f"{self.n} frames, got shape {targets.shape}"
        )
      _numeric(path, targets, "'targets'")
    self._targets = targets
    self.has_targets = targets is not None

  def rows(self, lo: int, hi: int) -> np.ndarray:
    """Frames lo .. hi (hi - lo, R) in float64."""
    rows = np.asarray(self._frames(lo, min(hi, self.n)), np.float64)
    return rows if self.sign > 0 else -rows

  def targets(self, rows: np.ndarray | None = None) -> np.ndarray | None:
    """The true images (len(rows), size, size) float32 of frames `rows` (all: None), or None."""
    if self._targets is None:
      return None
    if rows is None:
      return np.asarray(self._targets, np.float32)
    return np.stack([np.asarray(self._targets[int(r) : int(r) + 1], np.float32)[0] for r in rows])

  def close(self) -> None:
    self._arrays.close()

  def __enter__(self) -> Recording:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read(
  path: str, num_values: int = NUM_MEASUREMENTS, system: str | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
  """(frames (N, R) float64, reference frame (R,) or None, true images (N, 128, 128) or None)
  of a frames file, read whole (`Recording` reads one a block at a time)."""
  with Recording(path, num_values, system) as r:
    return r.rows(0, r.n), r.reference, r.targets()


def _pick(path: str, arrays: dict[str, Any], keys, required: bool) -> Any:
  for k in keys:
    if k in arrays:
      return arrays[k]
  if not required:
    return None
  others = [k for k in arrays if k not in REFERENCE_KEYS and k != "targets"]
  if len(others) == 1:
    return arrays[others[0]]
  omitted = getattr(arrays, "omitted", {})
  held = sorted(arrays) or "no array of numbers"
  beside = "; ".join(f"{k!r}: {why}" for k, why in sorted(omitted.items()))
  raise InputError(
    f"{path}: no frames: it holds {held}{f' (besides {beside})' if beside else ''}; name the "
    f"frames array {FRAME_KEYS[0]!r} (and a reference frame {REFERENCE_KEYS[0]!r})"
  )


def _text_shape(path: str, table: array_files.TextTable, m: int) -> None:
  """A text table of rows of another width than `m` is refused as soon as its first rows say
  so (not after a pass over a long file): one line of many values (no reshape is guessed), or
  more rows than the `m` a table of one frame a column holds (a shorter one is refused by its
  shape, with the systems of as many values)."""
  if table.width == m:
    return
  rows = table.rows_upto(m + 1)
  if rows == 0:
    raise InputError(f"{path}: no rows of numbers (an empty file, or a header or comments only)")
  if rows == 1 and table.width > m:
    raise InputError(
      f"{path}: one line of {table.width} values; frames are rows of {m} voltages, one frame a "
      f"line: write each frame on a line of its own (the file's line ends may be lost: LF, CRLF "
      "and CR are read)"
    )
  if rows > m:
    values = f"{table.width} value{'s' * (table.width != 1)}"
    raise InputError(
      f"{path}: its first data row holds {values}, and it has more than {m} rows: frames must "
      f"be rows of {m} voltages (N, {m}), one frame a line (or {m} rows of frames as columns)"
    )


def _numeric(path: str, a, what: str):
  """`a` itself, refused unless of real numbers (its dtype; its values are read later)."""
  if a.dtype.kind not in "fiu":
    raise InputError(f"{path}: {what} must be real numbers, got dtype {a.dtype}")
  return a


# ----------------------------------------------------------------------------- outputs


def colour_limit(images: np.ndarray) -> float:
  """One symmetric colour limit for a whole sequence: the 99.5th percentile of |image| over the
  disk (a few extreme pixels do not wash the rest out)."""
  mask = disk_mask(images.shape[-1])
  vals = np.abs(images[:, mask])
  vals = vals[np.isfinite(vals)]
  return float(max(np.percentile(vals, 99.5), 1e-6)) if vals.size else 1.0


class FramesWriter:
  """The outputs of `n` frames into `folder` (a staging folder), filled as the frames are imaged
  (`add`), so memory stays flat however long the recording: `images` and `std` are streamed
  into files (`common.streamed_npz`) and double matrices of frames.mat (`matfile`, the device's
  conductivity units); the frames the figures show (at most `most` evenly spaced, all of a
  short recording) are the only images kept. Rows `skipped` are NaN from the start. `finish`
  completes frames.npz (np.savez's layout, uncompressed), frames.mat and the figures."""

  def __init__(
    self,
    folder: str,
    n: int,
    size: int,
    with_std: bool,
    skipped: np.ndarray,
    mat_scale: float,
    most: int = 300,
  ):
    self.folder, self.n, self.size, self.mat_scale = folder, n, size, float(mat_scale)
    self.names = ("images", "std") if with_std else ("images",)
    self.rows, self.skipped = np.arange(n), np.asarray(skipped, np.int64)
    self.kept = _evenly(n, most)
    self.shown = {
      name: np.full((len(self.kept), size, size), np.nan, np.float32) for name in self.names
    }
    self.nonfinite = []
    self.arrays = streamed_npz.StreamedNpz(folder, {name: (n, size, size) for name in self.names})
    # MATLAB counts rows from 1 (`images(rows(k), :, :)` is frame k); skipped: at the end
    small = {"rows": self.rows.astype(np.float64) + 1, "scale": mat_scale}
    self.mat = matfile.Writer(
      os.path.join(folder, "frames.mat"), {name: (n, size, size) for name in self.names}, small
    )
    nan = np.full((1, size, size), np.nan, np.float32)
    for row in self.skipped:
      self.add(int(row), nan, nan if with_std else None)

  def add(self, lo: int, images: np.ndarray, std: np.ndarray | None) -> None:
    """Frames lo .. lo + len(images): images and std (b, H, W) in label units."""
    arrays = {"images": images, "std": std}
    scales = {"images": self.mat_scale, "std": abs(self.mat_scale)}
    for name in self.names:
      a = np.asarray(arrays[name], np.float32)
      self.arrays.write(name, lo, a)
      self.mat.write(name, lo, a * scales[name])  # float32 products, as before, widened
      keep = np.flatnonzero((self.kept >= lo) & (self.kept < lo + len(a)))
      self.shown[name][keep] = a[self.kept[keep] - lo]
    bad = lo + np.flatnonzero(~np.isfinite(np.asarray(images)).all(axis=(1, 2)))
    self.nonfinite += [int(r) for r in bad if r not in set(self.skipped.tolist())]

  def finish(
    self, info: dict[str, Any], *, fps: float, figures: bool, targets: np.ndarray | None
  ) -> list[str]:
    """Complete frames.mat, frames.npz (and the figures, with the true images `targets` of the
    kept frames beside them); returns the names written, frames.npz (the marker) last."""
    import json

    self.arrays.close()
    # frames whose images came out NaN or infinite are bad frames too, listed with the skipped
    self.skipped = np.union1d(self.skipped, np.asarray(self.nonfinite, np.int64))
    self.mat.close({"skipped": self.skipped.astype(np.float64) + 1})  # from 1, as rows
    written = ["frames.mat"]
    if figures:
      written += self._figures(fps, targets)
    self.arrays.pack(
      os.path.join(self.folder, "frames.npz"),
      [
        "images",
        ("rows", self.rows),
        ("skipped", self.skipped),
        ("info", np.asarray(json.dumps(info))),
        *self.names[1:],  # std, when there is one
      ],
    )
    return [*written, "frames.npz"]

  def _figures(self, fps: float, targets: np.ndarray | None) -> list[str]:
    images, rows = self.shown["images"], self.kept
    limit = colour_limit(images if targets is None else np.concatenate([images, targets]))
    fileio.atomic_write(
      os.path.join(self.folder, "montage.png"),
      lambda p: save_montage(p, images, rows, limit, targets),
    )
    fileio.atomic_write(
      os.path.join(self.folder, "frames.gif"),
      lambda p: save_gif(p, images, rows, limit, fps, len(rows), targets),
    )
    return ["montage.png", "frames.gif"]


def _shown(img: np.ndarray) -> np.ndarray:
  return np.ma.masked_where(~disk_mask(img.shape[-1]), img)


def _evenly(n: int, most: int) -> np.ndarray:
  return np.unique(np.linspace(0, n - 1, min(n, most)).round().astype(int))


def save_montage(
  path: str,
  images: np.ndarray,
  rows: np.ndarray,
  limit: float,
  targets: np.ndarray | None = None,
  most: int = 32,
) -> None:
  """Up to `most` frames, evenly spaced, on one colour scale (with `targets`: each true image
  above its reconstruction); electrode 0 on top."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  pick = _evenly(len(images), most // (1 if targets is None else 2))
  cols = min(8, len(pick))
  lines = -(-len(pick) // cols)
  per = 1 if targets is None else 2
  fig, axes = plt.subplots(
    lines * per, cols, figsize=(1.6 * cols + 1.2, 1.6 * lines * per + 0.3), squeeze=False
  )
  for ax in axes.ravel():
    ax.set_axis_off()
  im = None
  for j, i in enumerate(pick):
    line, col = divmod(j, cols)
    shown = (
      [(images[i], f"frame {int(rows[i])}")]
      if targets is None
      else [(targets[i], f"true {int(rows[i])}"), (images[i], "CDEIT")]
    )
    for r, (img, title) in enumerate(shown):
      ax = axes[line * per + r, col]
      im = ax.imshow(_shown(img), origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit)
      ax.set_title(title, fontsize=8)
  fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="conductivity change")
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")  # the colour bar's labels whole
  plt.close(fig)
  with open(path, "wb") as fh:
    fh.write(buf.getvalue())


def save_gif(
  path: str,
  images: np.ndarray,
  rows: np.ndarray,
  limit: float,
  fps: float,
  most: int,
  targets: np.ndarray | None = None,
) -> None:
  """The sequence as an animated GIF (at most `most` frames, evenly spaced; with `targets` the
  true image beside each), fixed colour scale and colourbar: each frame drawn by matplotlib,
  the GIF assembled by Pillow (matplotlib's own dependency; its animation writer names the
  format by the file's suffix, and this file is a temporary one)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from PIL import Image

  pick = _evenly(len(images), most)
  panels = 1 if targets is None else 2
  fig, axes = plt.subplots(1, panels, figsize=(0.3 + 2.9 * panels, 2.9), dpi=70, squeeze=False)
  axes = axes[0]
  shows = []
  for ax, name in zip(axes, ["CDEIT"] if targets is None else ["true", "CDEIT"]):
    ax.set_axis_off()
    shows.append(
      (
        ax.imshow(_shown(images[pick[0]]), origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit),
        ax.set_title("", fontsize=9),
        name,
      )
    )
  fig.colorbar(shows[-1][0], ax=axes.tolist(), fraction=0.046, pad=0.04)
  shots = []
  for i in pick:
    imgs = [images[i]] if targets is None else [targets[i], images[i]]
    for (im, title, name), img in zip(shows, imgs):
      im.set_data(_shown(img))
      title.set_text(f"{name}, frame {int(rows[i])}")
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    shots.append(Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE))
  plt.close(fig)
  shots[0].save(
    path,
    format="GIF",
    save_all=True,
    append_images=shots[1:],
    duration=int(round(1000 / fps)),
    loop=0,
  )
