"""Normalisation statistics of the conditioning voltages: `mean`, `std` of shape (1, 16, 13).

Reads `.npy` and the authors' `.pth` files, computes them over a training split, and decides which
statistics a dataset is standardised with. A `.pth` is read without torch and without running
pickled code: Python's documented "restricting globals" Unpickler admits only the few names a
single saved tensor uses (`torch.load(weights_only=True)` would need torch, which we don't require).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import pickle
import zipfile
from collections import OrderedDict
from importlib import resources
from typing import Any

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import CdeitError, InputError, MissingFile
from cdeit_jax.data import npz_files
from cdeit_jax.eit import measurement
from cdeit_jax.eit.measurement import NUM_MEASUREMENTS, STATS_SHAPE

log = logging.getLogger(__name__)

_STORAGE_DTYPES = {
  "FloatStorage": np.float32,
  "DoubleStorage": np.float64,
  "HalfStorage": np.float16,
  "LongStorage": np.int64,
  "IntStorage": np.int32,
}


class _Storage:
  def __init__(self, dtype):
    self.dtype = dtype


class _RestrictedUnpickler(pickle.Unpickler):
  """Admits a tensor's rebuild function, storage types and OrderedDict; refuses anything else."""

  def __init__(self, fh, archive: zipfile.ZipFile, prefix: str, path: str, byteorder: str):
    super().__init__(fh)
    self.archive, self.prefix, self.path, self.byteorder = archive, prefix, path, byteorder

  def find_class(self, module, name):
    if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
      return self._rebuild_tensor_v2
    if module == "torch" and name in _STORAGE_DTYPES:
      return _Storage(_STORAGE_DTYPES[name])
    if (module, name) == ("collections", "OrderedDict"):
      return OrderedDict
    raise InputError(
      f"{self.path}: refusing to load {module}.{name}: only a plain saved tensor "
      "is accepted here (save mean/std with torch.save(tensor) or as .npy)"
    )

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
      raise InputError(f"{self.path}: unsupported persistent id {pid!r}")
    _, storage_type, key, _location, numel = pid
    if not isinstance(storage_type, _Storage):
      raise InputError(f"{self.path}: unsupported storage type {storage_type!r}")
    name = f"{self.prefix}/data/{key}"
    try:
      raw = self.archive.read(name)
    except KeyError:
      raise InputError(f"{self.path}: the archive has no storage {name!r}") from None
    dtype = np.dtype(storage_type.dtype).newbyteorder("<" if self.byteorder == "little" else ">")
    if not _is_int(numel) or numel < 0 or len(raw) != numel * dtype.itemsize:
      raise InputError(
        f"{self.path}: storage {name!r} holds {len(raw)} bytes, not the "
        f"{numel!r} x {dtype.itemsize} its header declares"
      )
    return np.frombuffer(raw, dtype=dtype, count=numel).astype(storage_type.dtype)

  def _rebuild_tensor_v2(
    self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None
  ):
    """A tensor view of `storage`, after checking that every element it addresses lies inside
    the storage (a crafted header could otherwise read past the buffer)."""
    if not isinstance(storage, np.ndarray):
      raise InputError(f"{self.path}: a tensor refers to {type(storage).__name__}, not a storage")
    if not (
      isinstance(size, tuple)
      and isinstance(stride, tuple)
      and len(size) == len(stride)
      and all(_is_int(v) for v in (offset, *size, *stride))
    ):
      raise InputError(
        f"{self.path}: malformed tensor header (offset {offset!r}, size "
        f"{size!r}, stride {stride!r})"
      )
    if offset < 0 or any(v < 0 for v in (*size, *stride)):
      raise InputError(
        f"{self.path}: negative offset, size or stride in tensor header "
        f"(offset {offset}, size {size}, stride {stride})"
      )
    count = int(np.prod(size, dtype=np.int64)) if size else 1
    if count:
      last = offset + sum((n - 1) * s for n, s in zip(size, stride))
      if last >= storage.size:
        raise InputError(
          f"{self.path}: tensor of size {size}, stride {stride} at offset {offset} reaches "
          f"element {last} of a storage of {storage.size}; the file is damaged or crafted"
        )
    itemsize = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
      storage[offset:], shape=size, strides=tuple(s * itemsize for s in stride)
    ).copy()


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def read_pth_tensor(path: str) -> np.ndarray:
  """The single tensor saved in a PyTorch zip archive (`torch.save(tensor, path)`), as numpy."""
  try:
    fh = fileio.open_binary(path)
    try:
      archive = zipfile.ZipFile(fh)
    except BaseException:
      fh.close()
      raise
  except (OSError, zipfile.BadZipFile) as e:
    raise InputError(
      f"{path}: not a PyTorch zip archive ({e}); re-save it with a recent "
      "torch.save or give a .npy file"
    ) from e
  with fh, archive:
    names = archive.namelist()
    pkl = [n for n in names if n.endswith("/data.pkl")]
    if len(pkl) != 1:
      raise InputError(f"{path}: expected one data.pkl in the archive, found {len(pkl)}")
    prefix = pkl[0][: -len("/data.pkl")]
    byteorder = "little"
    if f"{prefix}/byteorder" in names:
      byteorder = archive.read(f"{prefix}/byteorder").decode().strip()
    with archive.open(pkl[0]) as fh:
      obj = _RestrictedUnpickler(fh, archive, prefix, path, byteorder).load()
  if not isinstance(obj, np.ndarray):
    raise InputError(f"{path}: holds a {type(obj).__name__}, expected a single tensor")
  return obj


def read_array(path: str) -> np.ndarray:
  """A `.npy` or a single-tensor `.pth`."""
  if path.endswith(".npy"):
    try:
      return fileio.load_npy(path)
    except (OSError, ValueError) as e:
      raise InputError(f"{path}: not a readable .npy array ({e})") from e
  if path.endswith((".pth", ".pt")):
    return read_pth_tensor(path)
  raise InputError(f"{path}: statistics must be .npy or .pth")


def check_stats(mean: np.ndarray, std: np.ndarray, source: str = "statistics") -> tuple:
  """Validate and return float32 (mean, std) of shape (1, 16, 13), or (1, R) for another
  measuring system's R values (given as (R,) or (1, R), R != 208)."""
  mean = np.asarray(mean, np.float32)
  std = np.asarray(std, np.float32)
  if mean.size != NUM_MEASUREMENTS and mean.shape in ((mean.size,), (1, mean.size)):
    if std.shape != mean.shape:
      raise InputError(f"{source}: mean {mean.shape} and std {std.shape} differ in shape")
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
      raise InputError(f"{source}: mean or std holds non-finite values")
    if np.any(std <= 0):
      raise InputError(f"{source}: std has {(std <= 0).sum()} entries <= 0")
    return mean.reshape(1, -1), std.reshape(1, -1)
  for name, a in (("mean", mean), ("std", std)):
    # Only shapes that hold the (16 injections, 13 measurements) order: a (13, 16) array has 208
    # elements too, but in the other order.
    if a.size != NUM_MEASUREMENTS or not (
      a.shape == (NUM_MEASUREMENTS,) or a.shape[-2:] == STATS_SHAPE[1:]
    ):
      raise InputError(
        f"{source}: {name} has shape {a.shape}, expected {STATS_SHAPE} (or "
        "(16, 13), (208,)): 16 current injections x 13 measurements"
      )
    if not np.all(np.isfinite(a)):
      raise InputError(f"{source}: {name} holds non-finite values")
  if np.any(std <= 0):
    raise InputError(f"{source}: std has {(std <= 0).sum()} entries <= 0")
  return mean.reshape(STATS_SHAPE), std.reshape(STATS_SHAPE)


def check_count(mean: np.ndarray, num_values: int, where: str) -> None:
  """Refuse statistics of another count of values than the data's (another measuring system)."""
  if np.size(mean) != num_values:
    raise InputError(
      f"{where}: the normalisation statistics hold {np.size(mean)} values, the data "
      f"{num_values}: they belong to another measuring system (config.simulator.layout)"
    )


def find_stats_files(directory: str) -> tuple[str, str] | None:
  """(mean, std) paths in `directory`, `.npy` preferred over `.pth`; None if absent."""
  for ext in (".npy", ".pth"):
    m, s = fileio.join(directory, "mean" + ext), fileio.join(directory, "std" + ext)
    if fileio.path(m).is_file() and fileio.path(s).is_file():
      return m, s
  return None


def load_stats(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Statistics from a folder holding mean/std (.npy or .pth)."""
  if not fileio.path(path).is_dir():
    raise MissingFile(
      f"statistics folder {path}: not a directory (it should hold "
      "mean.npy and std.npy, or mean.pth and std.pth)"
    )
  found = find_stats_files(path)
  if found is None:
    raise MissingFile(f"statistics folder {path}: no mean.npy/std.npy or mean.pth/std.pth")
  return check_stats(read_array(found[0]), read_array(found[1]), source=path)


def authors_stats() -> tuple[np.ndarray, np.ndarray]:
  """The CDEIT authors' statistics of their simulated training set (shipped with the package)."""
  assets = resources.files("cdeit_jax") / "assets"
  return check_stats(
    fileio.load_numpy(str(assets / "mean.npy")),
    fileio.load_numpy(str(assets / "std.npy")),
    source="cdeit_jax/assets",
  )


# ----------------------------------------------------------------------------- datasets


@dataclasses.dataclass(frozen=True)
class Statistics:
  """The statistics a dataset is standardised with, and where they came from: `source` is
  "checkpoint", "authors", "given" (arrays) or the folder they were read from; `files` the
  (mean, std) files read, if any. `record()` goes into metrics.json, with a digest of the values
  (two evaluations used the same statistics exactly when their digests agree)."""

  mean: np.ndarray
  std: np.ndarray
  source: str
  files: tuple[str, str] | None = None

  def digest(self) -> str:
    """SHA-256 of the float32 mean then std, little-endian (the values, not the files)."""
    h = hashlib.sha256()
    for a in (self.mean, self.std):
      h.update(np.ascontiguousarray(a, "<f4").tobytes())
    return h.hexdigest()

  def record(self) -> dict[str, Any]:
    return {
      "source": self.source,
      "files": None if self.files is None else list(self.files),
      "sha256": self.digest(),
    }


def same_stats(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
  """Equal statistics (to float32 rounding), whatever their shapes' spelling."""
  return all(
    np.size(x) == np.size(y) and np.allclose(np.ravel(x), np.ravel(y), rtol=1e-6, atol=0)
    for x, y in zip(a, b)
  )


def _beside(root: str, lenient: bool) -> Statistics | None:
  """The statistics in `root` (a dataset's folder), or None; `lenient`: unreadable ones are
  named and left out (they are not what an evaluation with a checkpoint uses)."""
  found = find_stats_files(root)
  if found is None:
    return None
  try:
    return Statistics(*load_stats(root), source=root, files=found)
  except CdeitError as e:
    if not lenient:
      raise
    log.warning(f"{e} (left out)")
    return None


def resolve_stats(
  split_dir: str | None,
  stats: Any = None,
  checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
  *,
  flag: str = "--config.eval.stats",
) -> Statistics:
  """Statistics to standardise the split folder `split_dir` with:

  1. given (`stats`: arrays, a folder, or "authors"), reported when they differ from the
     checkpoint's;
  2. else the checkpoint's, when there is one (evaluation, reconstruction, a resumed training):
     the model was trained with them. Statistics in the dataset's folder (the split folder's
     parent, the authors' layout: `data/mean.pth` beside `data/test2017/`) that differ are named
     in one line with `flag`, which would use them; they are never taken silently;
  3. else the dataset folder's (a new training), as the authors' code looks them up.

  `split_dir` None: data that are no folder of files (a frames file): 1, else 2."""
  if isinstance(stats, str) and stats == "authors":
    chosen = Statistics(*authors_stats(), source="authors")
  elif isinstance(stats, (str, os.PathLike)):
    folder = os.fspath(stats)
    chosen = Statistics(*load_stats(folder), source=folder, files=find_stats_files(folder))
  elif stats is not None:
    chosen = Statistics(*check_stats(*stats, source="stats argument"), source="given")
  else:
    chosen = None
  if chosen is not None:
    if checkpoint_stats is not None and not same_stats((chosen.mean, chosen.std), checkpoint_stats):
      log.warning(
        f"the normalisation statistics given ({chosen.source}) differ from the checkpoint's, "
        "which the model was trained with; using the given ones"
      )
    return chosen
  root = None if split_dir is None else fileio.dirname(split_dir)
  if checkpoint_stats is not None:
    ck = Statistics(*check_stats(*checkpoint_stats, source="checkpoint"), source="checkpoint")
    beside = None if root is None else _beside(root, lenient=True)
    if beside is not None and not same_stats((beside.mean, beside.std), (ck.mean, ck.std)):
      log.warning(
        f"{beside.files[0]} and {beside.files[1]} differ from the checkpoint's statistics: "
        f"using the checkpoint's, which the model was trained with ({flag}={root} would use "
        "those files)"
      )
    return ck
  beside = None if root is None else _beside(root, lenient=False)
  if beside is not None:
    log.info(
      f"normalisation statistics: {beside.files[0]}, {beside.files[1]} (the data folder's, "
      "where the authors' code looks)"
    )
    return beside
  raise MissingFile(
    f"no normalisation statistics for {split_dir}: put mean/std (.npy or .pth) in {root}, "
    "pass stats=, or compute them with `python -m cdeit_jax.voltage_stats DATA/train`"
  )


def compute_stats(
  split_dir: str,
  units: str = "simulated",
  *,
  voltage_ratio: float | None = None,
  progress: bool = True,
  skip_bad: bool = False,
  num_values: int = NUM_MEASUREMENTS,
) -> tuple[np.ndarray, np.ndarray]:
  """Per-measurement mean and std (N-1) of `ys / voltage_ratio` over a split, streaming in
  float64 (`measurement.RunningStats`; the authors' statistics, shape (1, 16, 13))."""
  from tqdm import tqdm

  ratio, _ = measurement.resolve_ratios(units, voltage_ratio, 1.0)
  names = npz_files.check_folder(
    split_dir, npz_files.list_files(split_dir), skip_bad=skip_bad, num_values=num_values
  )
  if len(names) < 2:
    raise npz_files.DatasetError(f"data folder {split_dir}: need at least 2 files for a std (N-1)")
  running = measurement.RunningStats(num_values=num_values)
  read = lambda f: npz_files.read_npz(fileio.join(split_dir, f), ("ys",))["ys"]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:  # overlaps reads (object stores)
    ys = pool.map(read, names)
    for y in tqdm(
      ys, total=len(names), desc=f"stats {split_dir}", unit="file", disable=not progress
    ):
      running.add(y, ratio)
  return running.result(f"data folder {split_dir}")


def write_stats(out: str, mean: np.ndarray, std: np.ndarray) -> None:
  """Write OUT/mean.npy and OUT/std.npy, each atomically (never half-written)."""
  fileio.makedirs(out)
  for name, arr in (("mean", mean), ("std", std)):

    def save(p, a=arr):
      with open(p, "wb") as fh:  # a handle: np.save would append ".npy" to the temporary name
        np.save(fh, a)

    fileio.atomic_write(fileio.join(out, f"{name}.npy"), save)
