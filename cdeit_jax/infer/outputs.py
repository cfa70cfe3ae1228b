"""What an evaluation writes: metrics.json (last: it marks a complete evaluation), metrics.csv,
predictions.npz and .mat, and the figure of reconstructions. All are written beside the folder's
earlier outputs first (a hidden staging folder, `Staged`) and replace them only once every one is
complete, so a failed evaluation (a full disk, a kill) leaves the previous one whole. Publishing
replaces and removes only files that an earlier run wrote there, which it knows from the folder's
manifest (`MANIFEST`); a user's own file is kept, or, where it has an output's name, the command
stops before any work (`check_out`).

The arrays are written as the examples come (`Predictions`: files filled in place a chunk at a
time, os.pwrite), so an evaluation's memory does not grow with its test set."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import shutil
import tempfile

import numpy as np

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common import fileio, matfile, stages, streamed_npz
from cdeit_jax.common.errors import CdeitError, InputError
from cdeit_jax.eit.phantom import disk_mask

# Everything an evaluation writes into its output folder, metrics.json last: it marks a complete
# evaluation (an output folder never holds one evaluation's figure beside another's metrics).
OUTPUTS = (
  "reconstructions.png",
  "predictions.mat",
  "predictions.npz",
  "metrics.csv",
  "metrics.json",
)
SHOWN = 32  # examples in the figure


STAGING = ".staging-"  # in OUT: a run's outputs being made (`Staged`)
MANIFEST = ".cdeit-outputs.json"  # in OUT: the files this project wrote there (`Staged.commit`)


def check_place(out: str, data_path: str | None = None, workdir: str | None = None) -> None:
  """Refuse an `out` equal to, inside or around the data folder or the checkpoints of `workdir`
  (links resolved: publishing there could replace the data, and checkpoint retention may
  delete it), or at any depth in a model folder that ships with the code; reads and makes
  nothing."""
  shipped.refuse_write(out, "--out")
  checkpoints = None if workdir is None else fileio.join(fileio.real(workdir), "checkpoints")
  fileio.refuse_own_input(
    out, "--out", [("the data folder", data_path), ("the run's checkpoints", checkpoints)]
  )


def check_out(
  out: str,
  data_path: str | None = None,
  workdir: str | None = None,
  names: tuple[str, ...] | list[str] = (),
) -> None:
  """Fail before any work when `out` cannot take the outputs `names` (paths inside it): placed
  around the data or the checkpoints (`check_place`), a file, read-only, or holding a file of
  those names that this project did not write there (`check_names`). Makes `out`."""
  check_place(out, data_path, workdir)
  fileio.writable_folder(out, "--out")
  check_names(out, names)


def read_manifest(out: str) -> set[str]:
  """The files an earlier run published in `out` (paths inside it; none without a manifest)."""
  p = fileio.join(out, MANIFEST)
  fileio.refuse_link(p)
  text = fileio.read_text(p)
  if text is None:
    return set()
  try:
    files = json.loads(text)["files"]
    if not all(isinstance(f, str) for f in files):
      raise ValueError
  except (ValueError, KeyError, TypeError):
    raise InputError(
      f"{p}: damaged (it lists the files cdeit-jax wrote in {out}); remove it and the outputs "
      "it listed, or give another --out"
    ) from None
  return set(files)


def check_names(out: str, names, manifest: set[str] | None = None) -> None:
  """Refuse, in one line before any work, to publish `names` (paths inside `out`) where `out`
  holds a file of one of those names that no earlier run of ours wrote (not in `MANIFEST`), a
  folder of that name, or a symbolic link on the way (nothing is written through a link)."""
  if manifest is None:
    manifest = read_manifest(out)
  for name in names:
    parts = name.split("/")
    for depth in range(1, len(parts) + 1):
      p = fileio.join(out, *parts[:depth])
      last = depth == len(parts)
      if not fileio.is_remote(p) and os.path.islink(fileio.resolve(p)):
        raise InputError(
          f"--out {out}: {'/'.join(parts[:depth])} is a symbolic link: cdeit-jax writes no "
          "output through a link; remove the link or give another --out"
        )
      target = fileio.path(p)
      if not target.exists():
        break
      if not last and not target.is_dir():
        raise InputError(
          f"--out {out}: {'/'.join(parts[:depth])} is a file where the outputs need a folder; "
          "move it away or give another --out"
        )
      if last and (target.is_dir() or name not in manifest):
        raise InputError(
          f"--out {out}: {name} is there and was not written by cdeit-jax (it is not in "
          f"{MANIFEST}); move it away or give another --out: outputs never replace files they "
          "did not write"
        )


def json_clean(tree):
  """NaN and infinities as null: metrics.json stays valid JSON."""
  if isinstance(tree, dict):
    return {k: json_clean(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [json_clean(v) for v in tree]
  if isinstance(tree, (float, np.floating)):
    return float(tree) if np.isfinite(tree) else None
  if isinstance(tree, np.integer):
    return int(tree)
  return tree


class Staged:
  """A hidden staging folder in `out` whose files replace `out`'s earlier outputs at `commit`;
  `work` is where the files are made (the staging folder itself, or a local temporary folder
  when `out` is in a bucket: files written in place need a local disk)."""

  def __init__(self, out: str):
    self.out = out
    self.dir = fileio.join(out, f"{STAGING}{os.getpid()}")
    fileio.refuse_link(self.dir)
    for stale in stages.stale(out, STAGING):  # a dead run's (ours too: a reused pid), links too
      fileio.remove_tree(stale)
    fileio.makedirs(self.dir)
    self.work = tempfile.mkdtemp(prefix="cdeit-eval-") if fileio.is_remote(out) else self.dir

  def commit(self, written: list[str]) -> None:
    """Put the staged files `written` (paths inside the staging folder; the last one marks a
    complete set) in place in `out`, replacing what an earlier run published there (`MANIFEST`)
    and removing the files of it that this set lacks (a stale level folder, an old figure).
    Nothing else in `out` is touched: a file of one of these names that no manifest lists (not
    ours) is refused (`check_names`). The old marker goes first and the manifest lists old and
    new files until the new set is complete, so a failure half-way leaves no file unaccounted
    for."""
    old = read_manifest(self.out)
    check_names(self.out, written, old)  # again: a file may have appeared since the start
    if self.work != self.dir:  # made locally: upload into the bucket's staging folder
      for name in written:
        src = os.path.join(self.work, name)
        fileio.atomic_write(
          fileio.join(self.dir, name), lambda tmp, src=src: shutil.copyfile(src, tmp)
        )
    marker = written[-1]
    if marker in old:
      _remove(fileio.join(self.out, marker))
    _write_manifest(self.out, old | set(written))
    for name in written:
      fileio.move(fileio.join(self.dir, name), fileio.join(self.out, name))
    for name in sorted(old - set(written)):
      _remove(fileio.join(self.out, name))
      _remove_empty_parents(self.out, name)
    _write_manifest(self.out, set(written))
    self.abort()

  def abort(self) -> None:
    """Remove what was staged (the previous outputs stay as they were)."""
    fileio.remove_tree(self.dir)
    if self.work != self.dir:
      shutil.rmtree(self.work, ignore_errors=True)


def _remove(p: str) -> None:
  if not fileio.path(p).is_dir():  # a folder is not ours: the manifest lists files
    fileio.path(p).unlink(missing_ok=True)


def _remove_empty_parents(out: str, name: str) -> None:
  """Remove the folders of `name` inside local `out` that are left empty (a stale level folder)."""
  if fileio.is_remote(out):
    return  # an object store has no folders
  parts = name.split("/")[:-1]
  while parts:
    with contextlib.suppress(OSError):  # not empty (a user's file), or gone
      os.rmdir(fileio.resolve(fileio.join(out, *parts)))
    parts.pop()


def _write_manifest(out: str, files: set[str]) -> None:
  fileio.write_text(
    fileio.join(out, MANIFEST),
    json.dumps({"written_by": "cdeit-jax", "files": sorted(files)}, indent=1),
  )

  return True


def publish(out: str, write_all) -> list[str]:
  """Call write_all(folder) (a fresh local folder; it returns the paths it wrote inside it, the
  one that marks a complete set last), then put them in place of `out`'s earlier outputs
  (`Staged.commit`): a failure before that leaves the earlier outputs whole and no temporary
  file; a full disk is one line naming `out`. Returns the paths written."""
  staged = Staged(out)
  with failing(staged):
    written = write_all(staged.work)
    staged.commit(written)
  return written


@contextlib.contextmanager
def left_as_found(out: str):
  """Context of a command that writes into `out`: when it fails (a refusal, an error), an `out`
  folder it made is removed again if it is still empty (a local folder: nothing else is
  touched), so a refused command leaves nothing behind."""
  made = not fileio.path(out).exists()
  try:
    yield
  except BaseException:
    if made and not fileio.is_remote(out):
      with contextlib.suppress(OSError):
        os.rmdir(fileio.resolve(out))  # only if empty
    raise


class failing:
  """Context: on any failure, `staged.abort()`; a full disk, a file-size limit or a disk quota
  becomes one line naming the folder."""

  def __init__(self, staged: Staged):
    self.staged = staged

  def __enter__(self):
    return self.staged

  def __exit__(self, kind, e, tb):
    if e is None:
      return False
    self.staged.abort()
    if not isinstance(e, OSError) or isinstance(e, fileio.DiskFull):
      return False
    if e.errno == errno.ENOSPC:
      raise fileio.no_space(self.staged.out) from None
    if e.errno in (errno.EFBIG, errno.EDQUOT):
      what = "a file there would pass" if e.errno == errno.EFBIG else "it is over"
      limit = (
        "the largest file this process may write (`ulimit -f`) or its file system holds (a "
        "FAT32 disk: 4 GiB)"
        if e.errno == errno.EFBIG
        else "your disk quota there"
      )
      raise OutputError(
        f"{self.staged.out}: {what} {limit}; nothing was half-written there: write to another "
        "disk, or fewer frames a run"
      ) from None
    return False


class OutputError(CdeitError, OSError):
  """An output that cannot be written where it goes (one line naming the folder)."""


class Predictions:
  """predictions.npz and predictions.mat of `n` images (H, W, C), filled a chunk of examples at a
  time (`add`): each array streamed into a file in `folder` (`common.streamed_npz`); `finish`
  makes the npz and completes the .mat (`matfile`)."""

  def __init__(
    self, folder: str, n: int, image: tuple[int, ...], num_samples: int, mat_scale: float
  ):
    self.folder, self.n, self.k, self.image = folder, n, num_samples, tuple(image)
    self.mat_scale = float(mat_scale)
    self.shapes = {"pred": (n, *image), "target": (n, *image)}
    if num_samples > 1:
      self.shapes.update(std=(n, *image), samples=(num_samples, n, *image))
    self.arrays = streamed_npz.StreamedNpz(folder, self.shapes)
    self.mat = matfile.Writer(
      os.path.join(folder, "predictions.mat"),
      {name: (n, *image[:2]) for name in self.shapes if name != "samples"},
      {"scale": self.mat_scale},
    )

  def add(
    self, lo: int, pred: np.ndarray, target: np.ndarray, std: np.ndarray | None, samples: np.ndarray
  ) -> None:
    """Examples lo .. lo + b: pred, target, std (b, H, W, C); samples (K, b, H, W, C)."""
    self.arrays.write("pred", lo, pred)
    self.arrays.write("target", lo, target)
    self.mat.write("pred", lo, pred[..., 0].astype(np.float64) * self.mat_scale)
    self.mat.write("target", lo, target[..., 0])
    if self.k > 1:
      self.arrays.write("std", lo, std)
      for k in range(self.k):
        self.arrays.write("samples", (k, lo), samples[k])

  def scale_std(self, scale: float, chunk: int = 64) -> None:
    """Multiply the stored std by the uncertainty scale (known once every example is in, when it
    is fitted on them) and write the .mat's, a chunk at a time."""
    for lo in range(0, self.n, chunk):
      std = self.arrays.read("std", lo, min(chunk, self.n - lo)) * scale
      self.arrays.write("std", lo, std)
      self.mat.write("std", lo, std[..., 0].astype(np.float64) * abs(self.mat_scale))

  def finish(self, names: list[str]) -> list[str]:
    """Complete both files (the .mat gets `names`); returns their names."""
    self.arrays.close()
    self.mat.close({"names": np.asarray(names, dtype=object)})
    self.arrays.pack(
      os.path.join(self.folder, "predictions.npz"),
      [*self.shapes, ("names", np.asarray(names))],  # the arrays streamed from their files
    )
    return ["predictions.mat", "predictions.npz"]


def write_outputs(
  staged: Staged,
  result: dict,
  rows: list[dict],
  names: list[str],
  predictions: Predictions,
  shown: dict[str, np.ndarray] | None,
  extra: list[str] | tuple[str, ...] = (),
) -> None:
  """Finish an evaluation's outputs in `staged` and put them in place: metrics.csv, the
  predictions, the figure of the first examples (`shown`: their target, pred, std and scaled
  baselines; None: no figure), the files `extra` already written in `staged.work`, metrics.json
  last."""
  folder = staged.work

  def write_csv(p):
    with open(p, "w", newline="") as fh:
      w = csv.DictWriter(fh, fieldnames=["name", *rows[0].keys()])
      w.writeheader()
      for name, r in zip(names, rows):
        w.writerow({"name": name, **r})

  fileio.atomic_write(os.path.join(folder, "metrics.csv"), write_csv)
  written = ["metrics.csv", *predictions.finish(names)]
  if shown is not None:
    fileio.atomic_write(
      os.path.join(folder, "reconstructions.png"),
      lambda p: save_figure(
        p, names, shown["target"], shown["pred"], shown.get("std"), shown["baselines"]
      ),
    )
    written.append("reconstructions.png")
  written += list(extra)
  fileio.write_text(
    os.path.join(folder, "metrics.json"), json.dumps(json_clean(result), indent=2, allow_nan=False)
  )
  staged.commit([*written, "metrics.json"])


def save_figure(path: str, names, target, pred, std, baselines, max_rows: int = 32) -> None:
  """Ground truth | reconstruction | uncertainty | baselines per image, electrode 0 on top."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = [
    "ground truth",
    "CDEIT",
    "std (uncertainty)" if std is not None else None,
    *[f"{k} (scaled)" for k in baselines],
  ]
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
      im = ax.imshow(
        shown,
        origin="lower",
        cmap="viridis" if is_std else "RdBu_r",
        vmin=0 if is_std else -1,
        vmax=None if is_std else 1,
      )
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
