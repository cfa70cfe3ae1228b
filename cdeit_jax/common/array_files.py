"""Named numeric arrays from a user's file, one reader per format: the one registry that device
files (`eit.layout.from_device_file`) and frames files (`infer.frames.read`) read through.

A new file format is one reader registered here (`@reader(".ext")`: path and bytes in, named
arrays out, an InputError naming the file when they cannot be read) and a test; a new vendor's
keys inside those files are one `eit.layout.DeviceFormat`. Formats of one unnamed array (`.npy`,
`.csv`) give it under `SINGLE`.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

import numpy as np

from cdeit_jax.common import fileio, matfile
from cdeit_jax.common.errors import InputError, MissingFile

Reader = Callable[[str, bytes], dict[str, np.ndarray]]
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


def read(path: str, suffixes: tuple[str, ...], what: str) -> dict[str, np.ndarray]:
  """The named arrays of `path`, a `what` (e.g. "device file") in one of `suffixes`; one-line
  errors naming the file for a missing file, a folder, another suffix or an unreadable file."""
  kinds = " or ".join(suffixes)
  if fileio.path(path).is_dir():
    raise InputError(f"{path}: a folder; a {what} is a {kinds} file")
  if suffix(path) not in suffixes:
    raise InputError(f"{path}: a {what} is a {kinds} file; got {suffix(path) or 'no'} suffix")
  try:
    raw = fileio.path(path).read_bytes()
  except FileNotFoundError:
    raise MissingFile(f"{path}: no such {what}") from None
  except IsADirectoryError:
    raise InputError(f"{path}: a folder; a {what} is a {kinds} file") from None
  return READERS[suffix(path)](path, raw)


def _short(e: BaseException) -> str:
  return " ".join(str(e).split())[:200]


@reader(".npz")
def _npz(path: str, raw: bytes) -> dict[str, np.ndarray]:
  try:
    return fileio.load_npz(raw)
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise InputError(f"{path}: not a readable .npz of numeric arrays ({_short(e)})") from None


@reader(".mat")
def _mat(path: str, raw: bytes) -> dict[str, np.ndarray]:
  return matfile.read(path, raw, other=".npz")


@reader(".npy")
def _npy(path: str, raw: bytes) -> dict[str, np.ndarray]:
  try:
    return {SINGLE: fileio.load_npy(raw)}
  except ValueError as e:
    raise InputError(f"{path}: not a .npy of numbers ({_short(e)})") from None
  except (OSError, EOFError) as e:
    raise InputError(f"{path}: not a readable .npy file ({_short(e)})") from None


@reader(".csv", ".txt")
def _text(path: str, raw: bytes) -> dict[str, np.ndarray]:
  """A table of numbers: commas, spaces or tabs between them, optionally one header line."""
  text = raw.decode("utf-8", errors="replace")
  first = next((ln for ln in text.splitlines() if ln.strip()), "")
  delimiter = "," if "," in first else None
  try:
    float((first.split(delimiter) if delimiter else first.split())[0])
    skip = 0
  except (ValueError, IndexError):
    skip = 1  # a header line
  try:
    a = np.loadtxt(io.StringIO(text), delimiter=delimiter, skiprows=skip, ndmin=2, dtype=np.float64)
  except ValueError as e:  # numpy names the row and column
    raise InputError(
      f"{path}: not a table of numbers ({_short(e)}); give one row of numbers per frame, "
      "separated by commas, spaces or tabs, with a '.' decimal point (not ';' with decimal "
      "commas), optionally after one header line"
    ) from None
  return {SINGLE: a}
