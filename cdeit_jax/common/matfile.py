"""MAT-files: the one writer of big outputs (MATLAB v7.3, filled a block of rows at a time, no
size limit) and the one reader of users' MAT files (v4 to v7.3, a v7.3 variable readable a block
at a time).

Written as MATLAB v7.3, which is HDF5 with a 512-byte MATLAB header: the v5 format holds at most
2 GiB per variable, which 16,384 images of 128 x 128 doubles reach (5.5 minutes of frames at
50 frames/s). hdf5storage (MATLAB's layout of HDF5: the header, small variables, strings, cells,
empty arrays) writes the file and its small variables; the big matrices are HDF5 datasets that
h5py fills in place, chunked along the examples, so that memory stays flat however many rows.
MATLAB keeps arrays column-major, so a MATLAB (N, H, W) matrix is an HDF5 dataset (W, H, N):
the axes reversed (`_Reversed`). MATLAB's `load`, hdf5storage.loadmat, mat73 and h5py read the
files; scipy.io.loadmat reads only v5.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from cdeit_jax.common.errors import InputError, MissingFile

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at byte 512 of a v7.3 MAT-file (after MATLAB's header)
CHUNK_BYTES = 1 << 21  # HDF5 chunks of about 2 MiB: whole ones for a block of 16 images


def _save(path: str, variables: dict, new: bool) -> None:
  """`variables` into the MAT-file `path` (a new one, or added to it), MATLAB's layout."""
  import hdf5storage

  hdf5storage.savemat(
    path,
    variables,
    appendmat=False,
    format="7.3",
    oned_as="row",
    store_python_metadata=False,
    truncate_existing=new,
  )


class Writer:
  """A MAT-file at `path` with the small variables `small` and, for each {name: shape} of
  `arrays`, a double matrix filled by rows (`write`). `close(more)` adds the small variables
  `more` and ends it; until then the file is incomplete."""

  def __init__(self, path: str, arrays: dict[str, tuple[int, ...]], small: dict):
    import h5py

    self.path, self.shapes = path, {k: tuple(map(int, s)) for k, s in arrays.items()}
    _save(path, small, new=True)
    self._file = h5py.File(path, "r+")
    self._data = {}
    for name, shape in self.shapes.items():
      per_row = 8 * int(np.prod(shape[1:]))
      rows = max(1, min(shape[0], CHUNK_BYTES // max(per_row, 1)))
      d = self._file.create_dataset(
        name, shape=shape[::-1], dtype="<f8", chunks=(*shape[:0:-1], rows) if shape[0] else None
      )
      d.attrs["MATLAB_class"] = np.bytes_("double")
      self._data[name] = d

  def write(self, name: str, lo: int, rows: np.ndarray) -> None:
    """Rows lo .. lo + len(rows) of matrix `name` (rows: (b, *shape[1:]))."""
    a = np.asarray(rows, "<f8").reshape(len(rows), *self.shapes[name][1:])
    self._data[name][..., lo : lo + len(a)] = a.T

  def close(self, more: dict | None = None) -> None:
    self._file.close()
    if more:
      _save(self.path, more, new=False)


class _Reversed:
  """A v7.3 variable as MATLAB sees it (an HDF5 dataset's axes reversed), read by slices
  (`a[lo:hi]`, `a[:, lo:hi]`) without reading the rest; `np.asarray` reads it whole."""

  def __init__(self, dataset):
    self._d = dataset
    self.shape, self.dtype, self.ndim = dataset.shape[::-1], dataset.dtype, dataset.ndim
    self.size = int(np.prod(self.shape))

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, key) -> np.ndarray:
    key = key if isinstance(key, tuple) else (key,)
    key = key + (slice(None),) * (self.ndim - len(key))
    return np.asarray(self._d[key[::-1]]).T

  def __array__(self, dtype=None, copy=None):
    a = np.asarray(self._d[()]).T
    return a if dtype is None else a.astype(dtype)


def is_v73(head: bytes) -> bool:
  """Whether a MAT-file's first 520 bytes are a v7.3 (HDF5) file's (its header or its HDF5)."""
  return head.startswith(b"MATLAB 7.3") or head[512:520] == HDF5_SIGNATURE


def open_v73(path: str, source) -> tuple[dict, Callable[[], None], dict[str, str]]:
  """(the numeric variables of a v7.3 MAT-file by name, read on access; the function that closes
  the file; the variables left out, each with why); `source`: its path or a file object.
  MATLAB's empty arrays are zero-size arrays; complex numbers, text, cells, structs and the
  rest are left out."""
  import h5py

  try:
    f = h5py.File(source, "r")
  except OSError as e:
    short = " ".join(str(e).split())[:200]
    raise InputError(f"{path}: not a readable MATLAB v7.3 (HDF5) file ({short})") from None
  out, omitted = {}, {}
  for name, item in f.items():
    if not isinstance(item, h5py.Dataset) or name.startswith("#"):
      continue
    kind = item.attrs.get("MATLAB_class", b"double")
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if item.dtype.names and {"real", "imag"} <= set(item.dtype.names):
      omitted[name] = "complex numbers (give real values: the part your device's protocol uses)"
      continue
    if kind in ("char", "cell", "struct", "function_handle") or item.dtype.kind not in "fiub":
      omitted[name] = f"a MATLAB {kind}, not an array of numbers"
      continue
    if item.attrs.get("MATLAB_empty", 0):
      out[name] = np.zeros(tuple(int(s) for s in np.asarray(item[()]).ravel()), np.float64)
    else:
      out[name] = _Reversed(item)
  return out, f.close, omitted


def read(path: str, raw: bytes | None = None) -> dict[str, np.ndarray]:
  """The numeric variables of a user's MAT file (v4 to v7.3; `raw`: its bytes, already read),
  whole, with one-line errors naming the file for a folder or a damaged file."""
  import scipy.io

  if raw is None:
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except FileNotFoundError:
      raise MissingFile(f"{path}: no such file") from None
    except IsADirectoryError:
      raise InputError(f"{path}: a folder, not a .mat file") from None
  if is_v73(raw[:520]):
    variables, close, _ = open_v73(path, io.BytesIO(raw))
    try:
      return {k: np.asarray(v) for k, v in variables.items()}
    finally:
      close()
  if raw.startswith(HDF5_SIGNATURE):
    raise InputError(
      f"{path}: an HDF5 file without MATLAB's v7.3 header (as h5py writes them); save it with "
      "MATLAB (save -v7.3) or hdf5storage.savemat(..., format='7.3'), or as .npz"
    )
  try:
    m = scipy.io.loadmat(io.BytesIO(raw))
  except (ValueError, TypeError, OSError, NotImplementedError, scipy.io.matlab.MatReadError) as e:
    short = " ".join(str(e).split())[:200]
    raise InputError(f"{path}: not a readable .mat file ({short})") from None
  return {k: v for k, v in m.items() if not k.startswith("__")}
