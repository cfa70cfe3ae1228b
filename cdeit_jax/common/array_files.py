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

import array
import re
import struct
import zipfile
from collections.abc import Callable, Iterator
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
CHUNK = 1 << 20  # bytes read at a time by the text tables' one pass over the file
PREFIX = 1 << 16  # the bytes of a first row that its header and decimal-comma checks read
_SPACE = b" \t\f\v"


@reader(".csv", ".txt")
def _text(path: str) -> Arrays:
  """A table of numbers: commas, semicolons, spaces or tabs between them, optionally one header
  line."""
  table = TextTable(path)
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


class _Row:
  """A data row met by `TextTable`'s pass: where it starts, its first PREFIX bytes and, fed a
  piece at a time, how many ';', ',' and whitespace-separated fields it holds (any length of
  line, in memory bounded by the piece)."""

  def __init__(self, start: int):
    self.start, self.prefix = start, b""
    self.semicolons = self.commas = self.words = 0
    self.in_word = False

  def feed(self, piece: bytes) -> None:
    if len(self.prefix) < PREFIX:
      self.prefix += piece[: PREFIX - len(self.prefix)]
    self.semicolons += piece.count(b";")
    self.commas += piece.count(b",")
    if not (self.semicolons or self.commas):  # whitespace-separated so far
      words = piece.split()
      self.words += len(words) - (self.in_word and piece[:1] not in b" \t\f\v" and bool(words))
      self.in_word = bool(piece) and piece[-1:] not in b" \t\f\v"

  @property
  def width(self) -> int:
    if self.semicolons:
      return self.semicolons + 1
    return self.commas + 1 if self.commas else self.words

  @property
  def text(self) -> str:
    return self.prefix.decode("utf-8", errors="replace")


class TextTable:
  """A table of numbers in a text file, parsed a block of rows at a time (`t[lo:hi]`, by
  np.loadtxt): one pass over the file, a chunk at a time, finds where each row starts (blank
  lines and '#' comments are no rows), in time and memory proportional to the file whatever
  its shape (one long line, CR-only line ends). LF, CRLF and CR-only (old Macs', some
  instruments') line ends are read alike, a byte-order mark is skipped; decimal commas are
  refused in one line (a ';' table of '0,5' is not a table of numbers here). `width`: the
  first row's count of numbers, known before the pass goes on; `rows_upto(k)` goes on only as
  far as k rows (a reader that expects rows of another width refuses a long file early)."""

  ndim, dtype = 2, np.dtype(np.float64)

  def __init__(self, path: str):
    self.path, self._fh = path, fileio.open_binary(path)
    self._starts = array.array("q")  # each data row's first byte
    self._pass = self._scan()
    self._done, self._first = False, []  # the first two data rows (`_Row`)
    try:
      self._check_head()
    except BaseException:
      self._fh.close()
      raise

  def _scan(self) -> Iterator[None]:
    """The one pass: yields after each data row that ends; `_end` is the file's length."""
    at, line_start, row, decided = 0, 0, None, False
    self._fh.seek(0)
    while chunk := self._fh.read(CHUNK):
      if at == 0 and chunk.startswith(BOM):  # the mark is no part of the first row
        chunk, at = chunk[len(BOM) :], len(BOM)
        line_start = at
      for piece in chunk.splitlines(keepends=True):  # at \n, \r and \r\n: line ends alike
        ends = piece[-1:] in (b"\n", b"\r")
        body = piece.rstrip(b"\r\n") if ends else piece
        if not decided:
          first = body.lstrip(_SPACE)[:1]
          if first:  # a line's first character decides: a row, or np.loadtxt's comment
            decided = True
            if first != b"#":
              row = _Row(line_start)
              self._starts.append(line_start)
        if row is not None:
          row.feed(body)
        at += len(piece)
        if ends:
          if row is not None and len(self._first) < 2:
            self._first.append(row)
          line_start, decided, ended, row = at, False, row, None
          if ended is not None:
            yield
    if row is not None and len(self._first) < 2:
      self._first.append(row)
    self._end, self._done = at, True

  def rows_upto(self, most: int) -> int:
    """The number of data rows, counted only as far as `most` (the pass goes on no further)."""
    while not self._done and len(self._starts) - self._header < most:
      next(self._pass, None)
    return len(self._starts) - self._header

  def _check_head(self) -> None:
    """The first two rows read (no further): a header line left out, decimal commas refused,
    the delimiter and the first row's `width` known."""
    while not self._done and len(self._first) < 2:
      next(self._pass, None)
    comma = re.compile(r"[-+]?\d*,\d+(?:[eE][-+]?\d+)?")
    for row in self._first:  # a number written '0,5' (a spreadsheet's decimal comma)
      delimiter, fields = _fields(row.text)
      if delimiter != "," and any(comma.fullmatch(f) for f in fields):
        raise InputError(
          f"{self.path}: decimal commas ({row.text.strip()[:40]}...); {ADVICE_TEXT} (e.g. save "
          "it again with a '.' decimal separator)"
        )
    # a header is a short line (a first row beyond PREFIX bytes is numbers: no system has so
    # many columns to number)
    first = self._first[0] if self._first else None
    self._header = int(
      first is not None and len(first.prefix) < PREFIX and _header(_fields(first.text)[1])
    )
    data = self._first[self._header :]
    self.delimiter = _fields(data[0].text)[0] if data else None
    self.width = data[0].width if data else 0
    if data and len(data[0].prefix) < PREFIX:  # a first row read whole: numbers, or named now
      line = data[0].text.strip()
      if not all(_is_number(f) for f in _fields(line)[1]):
        raise self._bad_row(0, [line])

  @property
  def shape(self) -> tuple[int, int]:
    return (self.rows_upto(np.iinfo(np.int64).max), self.width)

  @property
  def size(self) -> int:
    return self.shape[0] * self.shape[1]

  def __len__(self) -> int:
    return self.shape[0]

  def _row_start(self, k: int) -> int:
    return int(self._starts[k + self._header])

  def _parse(self, lo: int, hi: int) -> np.ndarray:
    n = len(self)
    if hi <= lo:
      return np.zeros((0, self.width))
    end = self._row_start(hi) if hi < n else self._end
    self._fh.seek(self._row_start(lo))
    text = self._fh.read(end - self._row_start(lo)).decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    try:
      a = np.loadtxt(lines, delimiter=self.delimiter, ndmin=2, dtype=np.float64)
    except ValueError:
      raise self._bad_row(lo, lines) from None
    if a.shape[1] != self.width:
      raise self._bad_row(lo, lines)
    return a

  def _bad_row(self, lo: int, lines: list[str]) -> InputError:
    """The one-line error of the first row of `lines` (data rows from `lo`) that is not `width`
    numbers: its data row and line, what it holds (numpy's own words stay out: its advice
    is for its own API)."""
    k, what = 0, "not read as numbers"  # numpy refused what each row alone passes
    for k, line in enumerate(lines):  # noqa: B007 (the row found is the loop's last)
      fields = line.split(self.delimiter) if self.delimiter else line.split()
      try:
        [float(f) for f in fields]
      except ValueError:
        word = next(f for f in fields if not _is_number(f)).strip()[:20]
        what = f"{word!r} is not a number" if word else "an empty field (two delimiters in a row)"
        break
      if len(fields) != self.width:
        what = f"holds {len(fields)} numbers, data row 0 {self.width}"
        break
    row = lo + k
    return InputError(
      f"{self.path}: not a table of numbers (data row {row}, line "
      f"{self._line_of(self._row_start(row))}: {what}); {ADVICE_TEXT}"
    )

  def _line_of(self, offset: int) -> int:
    """The line number (from 1) of the byte at `offset`: line ends before it counted (a CRLF
    once), a chunk at a time."""
    self._fh.seek(0)
    lines, left, last = 1, offset, b""
    while left > 0 and (chunk := self._fh.read(min(CHUNK, left))):
      left -= len(chunk)
      lines += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
      lines -= last == b"\r" and chunk[:1] == b"\n"
      last = chunk[-1:]
    return lines

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


def _is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True


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
