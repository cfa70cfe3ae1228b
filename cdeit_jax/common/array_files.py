"""Named numeric arrays from a user's file, one reader per format: the one registry that device
files (`eit.layout.from_device_file`) and frames files (`infer.frames`) read through.

A new file format is one reader registered here (`@reader(".ext")`: a path in, named arrays
out, an InputError naming the file when they cannot be read; `raw(path)` gives its bytes) and a
test; a new vendor's keys inside those files are one `eit.device_files.DeviceFormat`. Formats
of one unnamed array (`.npy`, `.csv`) give it under `SINGLE`.

A reader may give arrays that are read a block at a time (`a[lo:hi]`, `a[:, lo:hi]`; `np.asarray`
reads one whole), so that a recording of any length is read in flat memory (`open`): a local
`.npy`, and the members of an uncompressed `.npz` (np.savez's), are memory-mapped; a MATLAB v7.3
variable is read from its HDF5 dataset (`matfile`); a `.csv`/`.txt` is parsed by rows. A v5
`.mat` and a compressed `.npz` are read whole.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from cdeit_jax.common import fileio, matfile
from cdeit_jax.common.errors import InputError, MissingFile

Reader = Callable[[str], dict[str, Any]]
READERS: dict[str, Reader] = {}
SINGLE = ""  # the key of a format's one unnamed array


def reader(*suffixes: str) -> Callable[[Reader], Reader]:
  """Register a reader for files ending in `suffixes` (lower case, with the dot)."""

  def register(fn: Reader) -> Reader:
    for s in suffixes:
      READERS[s] = fn
    return fn

  return register


def suffix(path: str) -> str:
  """The file's suffix in lower case ('' for none)."""
  name = fileio.basename(path)
  return "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""


class Arrays(dict):
  """A file's arrays by name, some read on access; `close` (or `with`) releases the file.
  `omitted`: what the file holds beside them that is no array of numbers, {name: why}."""

  def __init__(
    self,
    arrays: dict,
    close: Callable[[], None] | None = None,
    omitted: dict[str, str] | None = None,
  ):
    super().__init__(arrays)
    self._close, self.omitted = close, dict(omitted or {})

  def close(self) -> None:
    if self._close is not None:
      self._close()
      self._close = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def open(path: str, suffixes: tuple[str, ...], what: str) -> Arrays:  # noqa: A001
  """The named arrays of `path`, a `what` (e.g. "frames file") in one of `suffixes`, those of
  the formats that allow it read on access (module docstring); one-line errors naming the file
  for a missing file, a folder, another suffix or an unreadable file."""
  kinds = " or ".join(suffixes)
  got = _source(path)
  if got is not None:
    return got
  if fileio.path(path).is_dir():
    raise InputError(f"{path}: a folder; a {what} is a {kinds} file")
  if suffix(path) not in suffixes:
    raise InputError(f"{path}: a {what} is a {kinds} file; got {suffix(path) or 'no'} suffix")
  if not fileio.path(path).exists():
    raise MissingFile(f"{path}: no such {what}")
  got = READERS[suffix(path)](path)
  return got if isinstance(got, Arrays) else Arrays(got)


def read(path: str, suffixes: tuple[str, ...], what: str) -> dict[str, np.ndarray]:
  """`open`'s arrays, each read whole."""
  with open(path, suffixes, what) as arrays:
    return {k: np.asarray(v) for k, v in arrays.items()}


def raw(path: str) -> bytes:
  """The file's bytes (local or gs://)."""
  try:
    return fileio.path(path).read_bytes()
  except FileNotFoundError:
    raise MissingFile(f"{path}: no such file") from None
  except IsADirectoryError:
    raise InputError(f"{path}: a folder, not a file") from None


def _short(e: BaseException) -> str:
  return " ".join(str(e).split())[:200]


@reader(".npz")
def _npz(path: str) -> Arrays:
  try:
    if fileio.is_remote(path):
      return Arrays(fileio.load_npz(raw(path)))
    return _npz_mapped(fileio.resolve(path))
  except (OSError, ValueError, zipfile.BadZipFile, EOFError, struct.error) as e:
    raise InputError(f"{path}: not a readable .npz of numeric arrays ({_short(e)})") from None


def _npz_mapped(path: str) -> Arrays:
  """An .npz's arrays: each uncompressed member memory-mapped where it lies in the archive (its
  local header's and its .npy header's lengths skipped), a compressed one read whole."""
  out, omitted = {}, {}
  with zipfile.ZipFile(path) as z, fileio.numpy_lock():
    for info in z.infolist():
      if not info.filename.endswith(".npy"):
        omitted[info.filename] = "not an .npy member (np.savez names them NAME.npy)"
        continue
      name = info.filename[: -len(".npy")]
      with z.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = {
          (1, 0): np.lib.format.read_array_header_1_0,
          (2, 0): np.lib.format.read_array_header_2_0,
        }.get(version)
        stored = info.compress_type == zipfile.ZIP_STORED and read_header is not None
        if stored:
          shape, fortran, dtype = read_header(fh)
          header = fh.tell()
        if not stored or dtype.hasobject or int(np.prod(shape)) == 0:
          fh.seek(0)
          out[name] = np.lib.format.read_array(fh, allow_pickle=False)
          continue
      with fileio.open_binary(path) as f:
        f.seek(info.header_offset)
        local = f.read(30)
        names, extra = struct.unpack("<HH", local[26:30])
      start = info.header_offset + 30 + names + extra + header
      out[name] = np.memmap(
        path, dtype=dtype, mode="r", offset=start, shape=shape, order="F" if fortran else "C"
      )
  return Arrays(out, omitted=omitted)


@reader(".mat")
def _mat(path: str) -> Arrays:
  if not fileio.is_remote(path):
    with fileio.open_binary(path) as fh:
      head = fh.read(520)
    if matfile.is_v73(head):
      arrays, close, omitted = matfile.open_v73(path, fileio.resolve(path))
      return Arrays(arrays, close, omitted)
  return Arrays(matfile.read(path, raw(path)))


@reader(".npy")
def _npy(path: str) -> Arrays:
  try:
    if fileio.is_remote(path):
      return Arrays({SINGLE: fileio.load_npy(raw(path))})
    with fileio.numpy_lock():
      a = np.load(fileio.resolve(path), mmap_mode="r", allow_pickle=False)
    if not isinstance(a, np.ndarray):
      a.close()
      raise ValueError("an .npz archive of named arrays, not one .npy array: name it .npz")
    return Arrays({SINGLE: a})
  except ValueError as e:
    raise InputError(f"{path}: not a .npy of numbers ({_short(e)})") from None
  except (OSError, EOFError) as e:
    raise InputError(f"{path}: not a readable .npy file ({_short(e)})") from None


ADVICE_TEXT = (
  "give one row of numbers per frame, separated by commas, semicolons, spaces or tabs, with a "
  "'.' decimal point (not decimal commas), optionally after one header line"
)
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: Excel's "CSV UTF-8", Python's utf-8-sig


@reader(".csv", ".txt")
def _text(path: str) -> Arrays:
  """A table of numbers: commas, semicolons, spaces or tabs between them, optionally one header
  line."""
  table = _TextTable(path)
  return Arrays({SINGLE: table}, table.close)


def _fields(line: str) -> tuple[str | None, list[str]]:
  """(the delimiter np.loadtxt is given, the fields) of a text row: ';' or ',' where one is
  there (';' first: its fields may hold decimal commas), else whitespace (spaces, tabs)."""
  for d in (";", ","):
    if d in line:
      return d, [f.strip() for f in line.split(d)]
  return None, line.split()


def _header(fields: list[str]) -> bool:
  """Whether a first row is a header: a field that is not a number (a name), or the column
  numbers themselves (1, 2, ..., N or 0, 1, ..., N - 1 with N >= 8: no EIT frame, whose 16 or
  more voltages are never those integers in turn)."""
  try:
    values = np.asarray([float(f) for f in fields])
  except ValueError:
    return True
  n = len(values)
  return n >= 8 and any(np.array_equal(values, np.arange(k, n + k)) for k in (0, 1))


class _TextTable:
  """A table of numbers in a text file, parsed a block of rows at a time (`t[lo:hi]`, by
  np.loadtxt): one pass over the file finds where each row starts (blank lines are no rows).
  A byte-order mark is skipped, CRLF line ends read as any others; decimal commas are refused in
  one line (a ';' table of '0,5' is not a table of numbers here)."""

  ndim, dtype = 2, np.dtype(np.float64)

  def __init__(self, path: str):
    self.path, self._fh = path, fileio.open_binary(path)
    starts, lines, at = [], [], 0
    for line in self._fh:
      if at == 0 and line.startswith(BOM):  # the mark is no part of the first row
        line, at = line[len(BOM) :], len(BOM)
      text = line.strip()
      if text and not text.startswith(b"#"):  # np.loadtxt's comments are no rows either
        if len(lines) < 2:
          lines.append(line.decode("utf-8", errors="replace"))
        starts.append(at)
      at += len(line)
    self._end = at
    comma = re.compile(r"[-+]?\d*,\d+(?:[eE][-+]?\d+)?")
    for line in lines:  # a number written '0,5' (a spreadsheet's decimal comma)
      if any(comma.fullmatch(f) for f in _fields(line)[1] if _fields(line)[0] != ","):
        raise InputError(
          f"{path}: decimal commas ({line.strip()[:40]}...); {ADVICE_TEXT} (e.g. save it "
          "again with a '.' decimal separator)"
        )
    if lines and _header(_fields(lines[0])[1]):
      starts, lines = starts[1:], lines[1:]
    self.delimiter = _fields(lines[0])[0] if lines else None
    self._starts = np.asarray(starts, np.int64)
    width = self._parse(0, 1).shape[1] if len(starts) else 0
    self.shape = (len(self._starts), width)
    self.size = self.shape[0] * self.shape[1]

  def __len__(self) -> int:
    return self.shape[0]

  def _parse(self, lo: int, hi: int) -> np.ndarray:
    n = len(self._starts)
    if hi <= lo:
      return np.zeros((0, self.shape[1] if hasattr(self, "shape") else 0))
    self._fh.seek(int(self._starts[lo]))
    end = int(self._starts[hi]) if hi < n else self._end
    text = self._fh.read(end - int(self._starts[lo])).decode("utf-8", errors="replace")
    try:
      a = np.loadtxt(io.StringIO(text), delimiter=self.delimiter, ndmin=2, dtype=np.float64)
    except ValueError as e:  # numpy names the row (counted from `lo`) and column
      where = f"in the {hi - lo} rows from data row {lo}: " if lo else ""
      raise InputError(
        f"{self.path}: not a table of numbers ({where}{_short(e)}); {ADVICE_TEXT}"
      ) from None
    if hasattr(self, "shape") and a.shape[1] != self.shape[1]:
      raise InputError(
        f"{self.path}: not a table of numbers (data row {lo} holds {a.shape[1]} numbers, row 0 "
        f"{self.shape[1]}); {ADVICE_TEXT}"
      )
    return a

  def __getitem__(self, key) -> np.ndarray:
    key = key if isinstance(key, tuple) else (key,)
    rows = key[0]
    if isinstance(rows, slice) and rows.step in (None, 1):
      lo, hi, _ = rows.indices(len(self))
      return self._parse(lo, hi)[(slice(None), *key[1:])]
    return np.asarray(self)[key]

  def __array__(self, dtype=None, copy=None):
    a = self._parse(0, len(self))
    return a if dtype is None else a.astype(dtype)

  def close(self) -> None:
    self._fh.close()


# ----------------------------------------------------------------------------- sources
# Recordings a path names by itself (a vendor's folder or file, e.g. Sciospec's), accepted wherever
# a device file or a frames file is: (claims(path), reader) in the order they are tried. Their
# readers live in modules of their own (`common.sciospec`), registered here.
SOURCES: list[tuple[Callable[[str], bool], Reader]] = []


def source(claims: Callable[[str], bool]) -> Callable[[Reader], Reader]:
  """Register a reader for the paths `claims` says are its format (a folder, a vendor's file)."""

  def register(fn: Reader) -> Reader:
    SOURCES.append((claims, fn))
    return fn

  return register


def _source(path: str) -> Arrays | None:
  for claims, read_source in SOURCES:
    if claims(path):
      got = read_source(path)
      return got if isinstance(got, Arrays) else Arrays(got)
  return None


from cdeit_jax.common import sciospec  # noqa: E402  (its recordings: registered below)

source(sciospec.claims)(sciospec.read)
