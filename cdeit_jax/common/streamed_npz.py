"""The one streamed writer of big .npz outputs (eval.py's predictions, the reconstruct command's
frames): float32 arrays of known shapes, each a .npy file in a local folder filled in place a
block of rows at a time (os.pwrite: neither the arrays nor a memory map's pages are held, so
memory stays flat however many rows), packed at the end into one .npz in np.savez's layout (a
zip of .npy files, uncompressed, zip64), the files streamed into it beside small arrays.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np


class StreamedNpz:
  """The arrays {name: shape} of `shapes` (float32, little-endian), each `.NAME.npy` in `folder`,
  written by rows (`write`), read back (`read`), then packed into an .npz (`pack`)."""

  def __init__(self, folder: str, shapes: dict[str, tuple[int, ...]]):
    self.folder = folder
    self.shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    self._fd, self._data = {}, {}
    for name, shape in self.shapes.items():
      with open(self.path(name), "wb") as fh:
        np.lib.format.write_array_header_1_0(
          fh, {"descr": "<f4", "fortran_order": False, "shape": shape}
        )
        self._data[name] = fh.tell()
        fh.truncate(self._data[name] + 4 * int(np.prod(shape)))
      self._fd[name] = os.open(self.path(name), os.O_RDWR)

  def path(self, name: str) -> str:
    """The .npy file of array `name` (hidden in the folder until packed)."""
    return os.path.join(self.folder, f".{name}.npy")

  def _offset(self, name: str, at: int | tuple[int, ...]) -> tuple[int, int]:
    """(byte offset, floats per row) of the row at index `at` along the leading axes of `name`
    (one index: the first axis; (k, i): row i of block k of an array (K, N, ...))."""
    at = (at,) if isinstance(at, (int, np.integer)) else tuple(at)
    shape = self.shapes[name]
    flat = 0
    for i, size in zip(at, shape):
      flat = flat * size + int(i)
    per_row = int(np.prod(shape[len(at) :]))
    return self._data[name] + 4 * per_row * flat, per_row

  def write(self, name: str, at: int | tuple[int, ...], rows: np.ndarray) -> None:
    """Rows of array `name` from index `at` (`_offset`) on, as float32."""
    offset, _ = self._offset(name, at)
    os.pwrite(self._fd[name], np.ascontiguousarray(rows, "<f4").data, offset)

  def read(self, name: str, at: int | tuple[int, ...], count: int) -> np.ndarray:
    """`count` rows of array `name` from index `at` on, as written."""
    offset, per_row = self._offset(name, at)
    raw = os.pread(self._fd[name], 4 * per_row * count, offset)
    n = 1 if isinstance(at, (int, np.integer)) else len(at)
    return np.frombuffer(raw, "<f4").reshape(count, *self.shapes[name][n:])

  def close(self) -> None:
    """Close the files (no more `write` or `read`); `pack` closes them too."""
    for fd in self._fd.values():
      os.close(fd)
    self._fd = {}

  def pack(self, path: str, entries: list[str | tuple[str, np.ndarray]]) -> None:
    """The .npz at `path` of `entries` in that order: a name is a streamed array (its file
    copied in and removed), (name, array) a small array written as it is (no pickles)."""
    self.close()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
      for entry in entries:
        if isinstance(entry, str):
          z.write(self.path(entry), f"{entry}.npy")
          continue
        name, a = entry
        with z.open(f"{name}.npy", "w", force_zip64=True) as fh:
          np.lib.format.write_array(fh, a, allow_pickle=False)
    for name in self.shapes:
      os.unlink(self.path(name))
