"""A model in one file: what `python -m cdeit_jax.export` writes and `python -m cdeit_jax.convert
--checkpoint FILE --workdir W` turns back into a workdir (an orbax checkpoint is many files in
deep folders; a model to share, or to bring back from a machine that returns a few flat files,
is one).

The container is safetensors (a JSON header, then the raw tensors; readable by any safetensors
library, no pickle):
- tensors: one weight set (the EMA weights) under their NNX paths joined by "/", float32;
- the header's `__metadata__` (safetensors keeps strings there):
  - `format`: FORMAT;
  - `record`: JSON of what the model needs and says of itself: `meta` (the step's checkpoint
    metadata: config, the measuring system as arrays, normalisation statistics, the
    physics-informed calibration, step, where the weights came from), `training` (steps, seconds,
    the machine), `uncertainty` (the step's fitted uncertainty scale, if any);
  - `sha256`: SHA-256 of the record's text and of every tensor (name, dtype, shape, bytes) in
    name order.

Reading checks what the file is (another format is named), the header's entries, the length the
header declares (a truncated file is named as one), the digest (one changed byte anywhere is
refused) and the tensors (float32, finite: an edited record's digest recomputed still cannot
bring NaN or other dtypes in), each in one line, before anything is used.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError, MissingFile

FORMAT = "cdeit-jax model file v1"
SUFFIX = ".safetensors"
WHAT = f"a model file ({SUFFIX}, python -m cdeit_jax.export)"
_HEADER = 8  # safetensors: a little-endian u64, the JSON header's length, then the header


class ModelFileError(InputError):
  """A model file that is not whole or not as written (one line)."""


def digest(record_text: str, arrays: dict[str, np.ndarray]) -> str:
  """SHA-256 of the record's text and every tensor (name, dtype, shape, bytes), in name order."""
  h = hashlib.sha256(record_text.encode())
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def write(path: str, arrays: dict[str, np.ndarray], record: dict[str, Any]) -> str:
  """Write the model file at `path` atomically (whole or not at all): a new file, or in place of
  a model file (nothing else is replaced: `fileio.atomic_write`); returns its digest."""
  from safetensors.numpy import save

  arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
  text = json.dumps(record, sort_keys=True)
  sha = digest(text, arrays)
  data = save(arrays, metadata={"format": FORMAT, "record": text, "sha256": sha})
  fileio.atomic_write(path, lambda tmp: open(tmp, "wb").write(data), ours=is_model_file, what=WHAT)
  return sha


# What a file that is not a model file starts with, for a message that names it
_OTHER_FORMATS = (
  (b"\x1f\x8b", "a gzip archive (decompress it first: gunzip)"),
  (b"\x93NUMPY", "a NumPy .npy array"),
  (b"PK\x03\x04", "a zip archive (an .npz, or a PyTorch checkpoint: convert it with --config)"),
  (b"\x80", "a Python pickle (a PyTorch checkpoint: convert it with --config)"),
  (b"\x89HDF", "an HDF5 file (MATLAB v7.3?)"),
  (b"MATLAB", "a MATLAB .mat file"),
)


def _entry_problem(name: str, t: Any) -> str | None:
  """What is wrong with a header entry as a tensor's (dtype, shape, data_offsets), or None."""
  ints = lambda v, n=None: (
    isinstance(v, list)
    and (n is None or len(v) == n)
    and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)
  )
  if not isinstance(t, dict):
    return f"entry {name!r} is a {type(t).__name__}, not a tensor's description"
  if not isinstance(t.get("dtype"), str) or not ints(t.get("shape")):
    return f"entry {name!r} has no dtype and shape of a tensor"
  if not ints(t.get("data_offsets"), 2) or t["data_offsets"][0] > t["data_offsets"][1]:
    return f"entry {name!r} has no data_offsets [start, end]"
  return None


def _header(data: bytes, where: str) -> dict[str, Any]:
  """The safetensors header of `data`, its declared length checked against the file's."""
  not_ours = f"{where}: not a cdeit-jax model file (python -m cdeit_jax.export writes them)"
  if len(data) < _HEADER:
    raise ModelFileError(f"{not_ours}: {len(data)} bytes")
  (size,) = struct.unpack("<Q", data[:_HEADER])
  if data[_HEADER : _HEADER + 1] not in (b"{", b""):  # a safetensors header is a JSON object
    other = next((what for magic, what in _OTHER_FORMATS if data.startswith(magic)), None)
    raise ModelFileError(f"{not_ours}: it is {other or 'not a safetensors file'}")
  if size > len(data) - _HEADER:
    raise ModelFileError(
      f"{where}: truncated: its header alone declares {size} bytes, the file has "
      f"{len(data) - _HEADER} after the length; copy the whole file again"
    )
  try:
    header = json.loads(data[_HEADER : _HEADER + size])
  except (ValueError, UnicodeDecodeError):
    raise ModelFileError(f"{not_ours}, or its header is damaged") from None
  meta = header.get("__metadata__") if isinstance(header, dict) else None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ModelFileError(f"{not_ours}: its header has no {FORMAT!r} format")
  tensors = {k: t for k, t in header.items() if k != "__metadata__"}
  problem = next(filter(None, (_entry_problem(k, t) for k, t in tensors.items())), None)
  if problem is not None:
    raise ModelFileError(f"{where}: its header is damaged or not as written ({problem})")
  ends = [t["data_offsets"][1] for t in tensors.values()]
  want = _HEADER + size + max(ends, default=0)
  if len(data) != want:
    what = "truncated" if len(data) < want else "longer than written (bytes added)"
    raise ModelFileError(
      f"{where}: {what}: {len(data)} bytes, its header declares {want}; copy the whole file again"
    )
  return meta


def is_model_file(path: str) -> bool:
  """Whether `path` is a file that starts as a model file does (the header's format)."""
  p = fileio.path(path)
  if not p.is_file():
    return False
  with fileio.open_binary(path) as fh:
    head = fh.read(_HEADER)
    if len(head) < _HEADER:
      return False
    (size,) = struct.unpack("<Q", head)
    if size > 100 << 20:  # not a safetensors header this size
      return False
    text = fh.read(size)
  return FORMAT.encode() in text


def read(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
  """(tensors, record, digest) of the model file at `path`, checked whole (module docstring)."""
  from safetensors import SafetensorError
  from safetensors.numpy import load

  where = f"model file {path}"
  if not fileio.path(path).is_file():
    raise MissingFile(f"{where}: no such file")
  data = fileio.path(path).read_bytes()
  meta = _header(data, where)
  try:
    arrays = load(data)
  except SafetensorError as e:
    raise ModelFileError(f"{where}: damaged ({e}); copy the whole file again") from None
  text, sha = meta.get("record", ""), meta.get("sha256", "")
  if digest(text, arrays) != sha:
    raise ModelFileError(
      f"{where}: its contents are not the ones written (SHA-256 differs from the one it "
      "records): the file was changed or damaged; copy it again from where it was exported"
    )
  try:
    record = json.loads(text)
  except ValueError:  # the digest matched: written so, not damaged
    raise ModelFileError(f"{where}: its record is not JSON") from None
  if not isinstance(record, dict) or not isinstance(record.get("meta"), dict):
    raise ModelFileError(f"{where}: its record holds no checkpoint metadata ('meta')")
  not_f32 = [f"{k} ({a.dtype})" for k, a in sorted(arrays.items()) if a.dtype != np.float32]
  nonfinite = [
    k for k, a in sorted(arrays.items()) if k not in not_f32 and not np.isfinite(a).all()
  ]
  for bad, what in ((not_f32, "are not float32"), (nonfinite, "hold NaN or infinite values")):
    if bad:
      shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
      raise ModelFileError(
        f"{where}: {len(bad)} of its weight tensors {what} ({shown}): python -m cdeit_jax.export "
        "writes float32, finite weights; export the run again"
      )
  return arrays, record, sha
