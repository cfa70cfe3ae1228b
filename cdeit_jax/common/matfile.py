"""MAT-file (v5) arrays filled in place, a chunk at a time: evaluation outputs whose memory stays
flat as the test set grows.

Hand-written because scipy.io.savemat (the one MAT writer in our dependencies) serialises each
variable from one array in memory; the few bytes of the format written here are the element
tags (MathWorks, "MAT-File Format", R2024a, ch. 1), and the file's header and small variables
still come from savemat itself. Each big variable is an uncompressed double matrix whose data is
column-major, as MATLAB keeps it: rows lo..hi of an (N, ...) matrix are, for each trailing index,
one run of hi - lo numbers, each written in place (os.pwrite; not a memory map, whose touched
pages would count as the process's memory). scipy.io.loadmat reads it back (tests/test_eval.py).
`read` is the one reader of users' MAT files (device files, frames, the challenge's data).
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np

from cdeit_jax.common.errors import InputError, MissingFile

_MI_INT8, _MI_INT32, _MI_UINT32, _MI_DOUBLE, _MI_MATRIX = 1, 5, 6, 9, 14
_MX_DOUBLE_CLASS = 6
LIMIT = 2**31 - 1  # bytes of one v5 variable (the tag's 32-bit size; MATLAB's own limit)


def _padded(b: bytes) -> bytes:
  return b + b"\0" * (-len(b) % 8)


def _matrix_tags(name: str, shape: tuple[int, ...]) -> tuple[bytes, int]:
  """The tags of a real double matrix up to its data, and the data's byte count."""
  data = 8 * int(np.prod(shape))
  flags = struct.pack("<II", _MI_UINT32, 8) + struct.pack("<II", _MX_DOUBLE_CLASS, 0)
  dims = struct.pack("<II", _MI_INT32, 4 * len(shape)) + _padded(np.asarray(shape, "<i4").tobytes())
  label = struct.pack("<II", _MI_INT8, len(name)) + _padded(name.encode("ascii"))
  body = flags + dims + label + struct.pack("<II", _MI_DOUBLE, data)
  if len(body) + data > LIMIT:
    raise ValueError(
      f"{name} {shape}: {len(body) + data} bytes, over the {LIMIT} bytes a "
      "MAT-file v5 variable can hold"
    )
  return struct.pack("<II", _MI_MATRIX, len(body) + data) + body, data


def _encoded(variables: dict) -> bytes:
  """A whole MAT-file of `variables` as savemat writes it (its 128-byte header first)."""
  import scipy.io

  buf = io.BytesIO()
  scipy.io.savemat(buf, variables, do_compression=False)
  return buf.getvalue()


def small_variables(variables: dict) -> bytes:
  """`variables` as savemat encodes them, without the file header: to append to a MAT-file."""
  return _encoded(variables)[128:]


class Writer:
  """A MAT-file at `path` with the small variables `small` (savemat's own encoding) and, for
  each {name: shape} of `arrays`, a double matrix filled by rows (`write`). `close` ends it;
  until then the file is incomplete."""

  def __init__(self, path: str, arrays: dict[str, tuple[int, ...]], small: dict):
    self.shapes = dict(arrays)
    self._offsets = {}
    end = 0
    with open(path, "wb") as fh:
      fh.write(_encoded(small))  # the 128-byte file header, then the small variables
      for name, shape in arrays.items():
        tags, size = _matrix_tags(name, shape)
        fh.write(tags)
        self._offsets[name] = fh.tell()
        end = fh.seek(size, io.SEEK_CUR)
      fh.truncate(end)
    self._fd = os.open(path, os.O_WRONLY)

  def write(self, name: str, lo: int, rows: np.ndarray) -> None:
    """Rows lo .. lo + len(rows) of matrix `name` (rows: (b, *shape[1:]))."""
    n = self.shapes[name][0]
    cols = np.reshape(np.asarray(rows, "<f8"), (len(rows), -1), order="F")  # (b, trailing)
    cols = np.ascontiguousarray(cols.T)  # one run of b numbers per trailing index
    base = self._offsets[name] + 8 * lo
    for f in range(cols.shape[0]):
      os.pwrite(self._fd, cols[f].data, base + 8 * n * f)

  def close(self) -> None:
    os.close(self._fd)


def read(path: str, raw: bytes | None = None, other: str = ".csv") -> dict[str, np.ndarray]:
  """The variables of a user's MAT file (v4-v7; `raw`: its bytes, already read), with one-line
  errors naming the file for a folder, a v7.3 (HDF5) file (advising `-v7` or `other`, the other
  format the caller reads) or a damaged one."""
  import scipy.io

  if raw is None:
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except FileNotFoundError:
      raise MissingFile(f"{path}: no such file") from None
    except IsADirectoryError:
      raise InputError(f"{path}: a folder, not a .mat file") from None
  try:
    m = scipy.io.loadmat(io.BytesIO(raw))
  except NotImplementedError:  # scipy: "Please use HDF reader for matlab v7.3 files"
    raise InputError(
      f"{path}: a MATLAB v7.3 (HDF5) file; save it with save(..., '-v7') or as {other}"
    ) from None
  except (ValueError, TypeError, OSError, scipy.io.matlab.MatReadError) as e:  # a damaged file
    short = " ".join(str(e).split())[:200]
    raise InputError(f"{path}: not a readable .mat file ({short})") from None
  return {k: v for k, v in m.items() if not k.startswith("__")}
