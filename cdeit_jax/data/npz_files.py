"""The CDEIT npz file format: one example per file, `ys` (208, 1) difference voltages (another
measuring system's: (R, 1), `config.simulator.layout`) in the measuring system's units
(`measurement.resolve_ratios`) and `xs` (128, 128) the conductivity-change target, optionally
`TR` and `xs_gn` (classical reconstructions, kept for evaluation); writing one (`file_name`,
`savez`: the simulator's and the held-out families' files), reading and validating a folder of
them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import zipfile
from collections.abc import Sequence

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit.measurement import IMAGE_SIZE, NUM_MEASUREMENTS

log = logging.getLogger(__name__)

BASELINE_KEYS = ("TR", "xs_gn")


def file_name(index: int) -> str:
  """Example `index`'s file name in a folder of them (`NNNNNNN.npz`)."""
  return f"{index:07d}.npz"


def savez(p: str, arrays: dict) -> None:
  """Write one example's arrays to `p` (an `fileio.atomic_write` writer)."""
  with open(p, "wb") as fh:  # a handle: np.savez would append ".npz" to the temporary name
    np.savez(fh, **arrays)


def read_npz(path: str, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """The arrays of an npz (all, or `keys` where present), decoded under `fileio`'s numpy lock."""
  return fileio.load_npz(path, keys)


# ----------------------------------------------------------------------------- validation


class DatasetError(InputError):
  """A dataset folder or file is unusable; the message names every bad file."""


# An example's voltages beyond LARGEST are in no device's units (10 V in nanovolts is 1e10) and
# their squares, which the statistics sum over a folder, overflow float32 (3.4e38) once summed;
# an example whose largest |ys| is FAR_FACTOR times its folder's typical one (the median of the
# files' largest) is in other units than the others (real targets' differences span a factor
# of about 1000, small objects to large).
LARGEST, FAR_FACTOR = 1e15, 1e6


def _read_checked(
  path: str, num_values: int = NUM_MEASUREMENTS
) -> tuple[str | None, dict[str, np.ndarray] | None]:
  """(problem or None, the file's arrays or None)."""
  try:
    with fileio.open_binary(path) as fh:
      head = fh.read(4)
    if head[:2] != b"PK":  # npz files are zip archives
      return f"not a readable npz: not a zip of .npy arrays (it starts with {head!r})", None
    z = read_npz(path)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    return f"not a readable npz ({type(e).__name__}: {e})", None
  return _problem(z, num_values), z


def _problem(z: dict[str, np.ndarray], num_values: int = NUM_MEASUREMENTS) -> str | None:
  for key, shape in (("ys", (num_values, 1)), ("xs", (IMAGE_SIZE, IMAGE_SIZE))):
    if key not in z:
      return f"missing key {key!r} (has {sorted(z)})"
    a = z[key]
    if a.size != int(np.prod(shape)) or a.shape not in (shape, (shape[0],)):
      return f"{key} has shape {a.shape}, expected {shape}"
    if not np.issubdtype(a.dtype, np.number):
      return f"{key} has dtype {a.dtype}, expected a float array"
    if not np.all(np.isfinite(a)):
      return f"{key} holds {int(np.size(a) - np.isfinite(a).sum())} non-finite values"
  largest = _largest(z)
  if largest > LARGEST:
    return (
      f"ys reaches {largest:.3g}: beyond {LARGEST:g}, no device's voltages in any units "
      "(the statistics' squares overflow float32)"
    )
  return None


def _largest(z: dict[str, np.ndarray] | None) -> float:
  """An example's largest |ys| (0 for none)."""
  ys = None if z is None else z.get("ys")
  return float(np.max(np.abs(ys))) if ys is not None and np.size(ys) else 0.0


def check_count(directory: str, name: str, num_values: int) -> None:
  """Refuse in one line a folder whose first file holds another measuring system's count of
  values than `num_values` (every file would be bad for the same reason)."""
  from cdeit_jax.eit import layout

  try:
    n = int(read_npz(fileio.join(directory, name), ("ys",))["ys"].size)
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return  # a damaged file: `check_folder` names it with the others
  if n != num_values:
    raise layout.frames_shape_error(f"data folder {directory} ({name}'s ys)", (n,), num_values)


def list_files(directory: str) -> list[str]:
  d = fileio.path(directory)
  if not d.is_dir():
    raise DatasetError(
      f"data folder {directory}: does not exist (expected a folder of .npz "
      "files, e.g. DATA/train, or gs://BUCKET/DATA/train)"
    )
  files = sorted(f.name for f in d.iterdir() if f.name.endswith(".npz"))
  if not files:
    raise DatasetError(f"data folder {directory}: holds no .npz files")
  return files


def _far(checked: list) -> list[str | None]:
  """Each file's problem, with those whose largest |ys| is FAR_FACTOR times the folder's
  typical file's named (other units)."""
  good = [largest for p, largest, _ in checked if p is None and largest > 0]
  typical = float(np.median(good)) if good else 0.0
  return [
    p
    if p is not None or typical == 0 or largest <= FAR_FACTOR * typical
    else (
      f"ys reaches {largest:.3g}, {largest / typical:.2g} times the folder's typical example's "
      f"largest ({typical:.3g}): other units than the other files'"
    )
    for p, largest, _ in checked
  ]


def check_folder(
  directory: str,
  files: Sequence[str],
  *,
  skip_bad: bool = False,
  num_threads: int = 8,
  keep: bool = False,
  num_values: int = NUM_MEASUREMENTS,
):
  """Check every file (`ys` must hold `num_values` voltages: 208, or another measuring
  system's count); raise listing all bad ones, or (skip_bad) warn and drop them. Returns the
  good file names, and with `keep` also their arrays ({name: arrays}: each file is read once)."""
  paths = [fileio.join(directory, f) for f in files]

  def read(path: str):  # without `keep` only the verdicts (the arrays would not fit)
    problem, z = _read_checked(path, num_values)
    return problem, _largest(z), z if keep else None

  with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
    checked = list(pool.map(read, paths))
  problems = _far(checked)
  checked = [(p, z) for p, (_, _, z) in zip(problems, checked)]
  arrays = {f: z for f, (p, z) in zip(files, checked) if p is None} if keep else None
  del checked
  bad = [(f, p) for f, p in zip(files, problems) if p is not None]
  if not bad:
    return (list(files), arrays) if keep else list(files)
  listing = "\n".join(f"  {fileio.join(directory, f)}: {p}" for f, p in bad[:50])
  more = f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else ""
  if not skip_bad:
    raise DatasetError(
      f"data folder {directory}: {len(bad)} of {len(files)} files are bad:\n"
      f"{listing}{more}\nFix or remove them, or skip them: "
      "--config.data.skip_bad_files=True (train.py), "
      "--config.eval.skip_bad_files=True (eval.py), --skip_bad_files "
      "(python -m cdeit_jax.voltage_stats)."
    )
  log.warning(
    "data folder %s: skipping %d of %d bad files:\n%s%s",
    directory,
    len(bad),
    len(files),
    listing,
    more,
  )
  good = [f for f, p in zip(files, problems) if p is None]
  if not good:
    raise DatasetError(f"data folder {directory}: every file is bad")
  return (good, arrays) if keep else good
