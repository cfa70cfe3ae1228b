"""Device files: a device's reference file (`.mat`/`.npz`, read through `common.array_files`) in
a vendor's keys (`DeviceFormat`, one registry: KTC's `Inj`/`Injref`, `Mpat`, `Uel`/`Uelref`; UEF's
`CurrentPattern`, `MeasPattern`, `Uel`), its arrays read and checked (`read`: the patterns and the
measured pairs; `DeviceFile.frame`: the empty tank's values in the rows' order), and a calibrated
device written back (`save_device`), with its own geometry, calibration and ranges.
`eit.layout.from_device_file` places the electrodes and makes the `Layout`."""

from __future__ import annotations

import dataclasses
import functools
import os
import zipfile

import numpy as np

from cdeit_jax.common import array_files, fileio
from cdeit_jax.common.errors import InputError


@dataclasses.dataclass(frozen=True)
class DeviceFormat:
  """A vendor's keys in a device file (`.mat`/`.npz`, read by `common.array_files`): each a
  tuple of names, the first present is taken; and how its electrodes are numbered."""

  name: str
  currents: tuple[str, ...]  # (E, P): the current patterns
  pattern: tuple[str, ...]  # (E, M): the measured pairs, one +1 and one -1 each
  values: tuple[str, ...]  # the empty tank's values, pattern by pattern or (M, P)
  clockwise: bool  # electrode numbers grow clockwise (from the top)
  described: str = ""  # how refusals name it, where not by its keys (a format read from a folder)


# The registry of device-file formats, in the order they are tried (`device_format`): a new
# vendor's keys are one more entry (`register_device_format`) and a test.
DEVICE_FORMATS: dict[str, DeviceFormat] = {}


def register_device_format(fmt: DeviceFormat) -> DeviceFormat:
  DEVICE_FORMATS[fmt.name] = fmt
  return fmt


register_device_format(DeviceFormat("KTC", ("Injref", "Inj"), ("Mpat",), ("Uelref", "Uel"), False))
register_device_format(DeviceFormat("UEF", ("CurrentPattern",), ("MeasPattern",), ("Uel",), True))
# a Sciospec recording (common.sciospec): its arrays' own names; electrodes numbered as UEF's
register_device_format(
  DeviceFormat(
    "Sciospec", ("sciospec_currents",), ("sciospec_pairs",), ("sciospec_empty",), True,
    "a Sciospec recording folder (docs/your_device.md)",
  )
)  # fmt: skip


def device_format(arrays: dict) -> DeviceFormat | None:
  """The format whose currents and measurement pattern `arrays` hold (a device file), else None."""
  return next(
    (
      f for f in DEVICE_FORMATS.values() if _first(arrays, f.currents) and _first(arrays, f.pattern)
    ),
    None,
  )


def _formats_text() -> str:
  return " or ".join(
    f.described
    or f"{f.name}'s keys {' or '.join(f.currents)}, {' or '.join(f.pattern)} (and "
    f"{' or '.join(f.values)})"
    for f in DEVICE_FORMATS.values()
  )


def _numbers(path: str, key: str, a, missing_ok: bool = False) -> np.ndarray:
  """Array `key` of a device file as float64: real numbers, not empty, finite (NaN allowed
  where `missing_ok`: a removed electrode's values); else an InputError naming both."""
  a = np.asarray(a)
  if a.dtype.kind == "c":
    raise InputError(
      f"{path}: {key} holds complex numbers; give the real (in-phase) part, e.g. real({key})"
    )
  if a.dtype.kind not in "fiu":
    raise InputError(f"{path}: {key} holds {a.dtype} values, not numbers")
  if a.size == 0:
    raise InputError(f"{path}: {key} is empty")
  a = a.astype(np.float64)
  bad = np.isinf(a) if missing_ok else ~np.isfinite(a)
  if bad.any():
    what = "infinite" if missing_ok else "NaN or infinite"
    raise InputError(
      f"{path}: {key} holds {int(bad.sum())} {what} values"
      + (" (a missing value is NaN)" if missing_ok else "")
    )
  return a


def _first(d: dict, keys: tuple[str, ...]) -> tuple[str, np.ndarray] | None:
  for k in keys:
    if k in d:
      return k, np.asarray(d[k])
  return None


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceFile:
  """A device file's arrays as `read` found and checked them (`eit.layout.from_device_file`
  places its electrodes and makes the layout)."""

  path: str
  arrays: dict  # every array of the file, by key
  format: DeviceFormat
  currents_key: str
  currents: np.ndarray  # (E, P) float64: every pattern's currents, as the file holds them
  pattern_key: str
  pairs: np.ndarray  # (M, 2): each measurement's electrode + and electrode -
  keep: np.ndarray  # the current patterns (columns) kept
  rows: np.ndarray  # (kept patterns x M, 3): pattern, electrode +, electrode -
  scale: float  # the largest current

  @property
  def num_electrodes(self) -> int:
    return self.currents.shape[0]

  @property
  def relative_currents(self) -> np.ndarray:
    """(E, kept patterns): the kept patterns' currents relative to the largest."""
    return self.currents[:, self.keep] / self.scale

  @functools.cached_property
  def given(self) -> dict[str, np.ndarray]:
    """The geometry and calibration of a calibrated device file (`DEVICE_KEYS`) that it holds."""
    return {k: _numbers(self.path, k, self.arrays[k]) for k in DEVICE_KEYS if k in self.arrays}

  @property
  def name(self) -> str:
    """The file's name and its keys', or a calibrated device file's own (`NAME_KEY`)."""
    name = f"{os.path.basename(self.path)} ({self.format.name} keys)"
    if NAME_KEY in self.arrays:  # a calibrated device file keeps its reference file's name
      name = str(np.asarray(self.arrays[NAME_KEY]).reshape(-1)[0])
    return name

  @property
  def calibration(self) -> dict[str, float]:
    """A calibrated device file's gain, contact impedance and current ratio, those it holds."""
    return {k: float(self.given[k].reshape(-1)[0]) for k in DEVICE_KEYS[2:] if k in self.given}

  def frame(self) -> np.ndarray | None:
    """The file's values (R,) in the rows' order (`_frame_values`: pattern by pattern or one
    column per pattern; NaN: missing), repeats checked (`_check_repeats`); None without any."""
    values = _first(self.arrays, self.format.values)
    if values is None:
      return None
    vk, v = values
    num_p, num_m = self.currents.shape[1], len(self.pairs)
    v = _frame_values(self.path, vk, _numbers(self.path, vk, v, missing_ok=True), num_p, num_m)
    v = v.reshape(num_p, num_m)[self.keep]
    currents = (self.currents_key, self.currents[:, self.keep].T)
    _check_repeats(self.path, vk, currents, self.pattern_key, self.pairs, v)
    return v.reshape(-1)


def read(path: str, patterns=None) -> DeviceFile:
  """A device file's arrays, checked (`eit.layout.from_device_file` makes its layout). KTC's keys
  (`Inj`/`Injref` (E, P), `Mpat` (E, M), `Uel`/`Uelref`) or UEF's (`CurrentPattern` (E, P),
  `MeasPattern` (E, M), `Uel`), or another registered format's (`DeviceFormat`); the values in
  either are (M*P, 1) pattern by pattern or (M, P), one column per pattern (`_frame_values`);
  measurement column m of pattern p is `Mpat[:, m] . U`, one +1 and one -1 each. Complex,
  non-finite (NaN values: missing) or non-numeric arrays, and fewer than 4 electrodes, are
  refused in one line. `patterns`: the current patterns (columns) to keep, indices or text such
  as "0-15,32"."""
  d = array_files.read(path, (".mat", ".npz"), "device file")
  fmt = device_format(d)
  if fmt is None:
    raise InputError(
      f"{path}: no measuring system found; a device file holds {_formats_text()}; it has "
      f"{sorted(k for k in d if not k.startswith('__'))}"
    )
  (ck, inj), (mk, mpat) = _first(d, fmt.currents), _first(d, fmt.pattern)
  inj, mpat = _numbers(path, ck, inj), _numbers(path, mk, mpat)
  if inj.ndim != 2 or mpat.ndim != 2 or inj.shape[0] != mpat.shape[0]:
    raise InputError(
      f"{path}: {ck} {inj.shape} and {mk} {mpat.shape} must both be (electrodes, ...) with the "
      "same electrode count"
    )
  n, (num_p, num_m) = inj.shape[0], (inj.shape[1], mpat.shape[1])
  keep = np.arange(num_p) if patterns is None else _patterns(path, ck, patterns, num_p)
  if n < 4:
    raise InputError(f"{path}: {ck} has {n} electrodes (rows); EIT needs at least 4")
  plus, minus = np.argmax(mpat, 0), np.argmin(mpat, 0)
  pm = np.zeros_like(mpat)
  pm[plus, np.arange(num_m)], pm[minus, np.arange(num_m)] = 1.0, -1.0
  if not np.array_equal(pm, mpat):
    bad = int(np.flatnonzero(np.any(pm != mpat, 0))[0])
    raise InputError(
      f"{path}: {mk} column {bad} is not one +1 and one -1 (a differential pair); other "
      "measurement patterns are not supported"
    )
  scale = np.abs(inj).max()
  if not scale > 0:
    raise InputError(f"{path}: {ck} holds no current")
  idle = keep[~np.any(inj[:, keep] != 0, axis=0)]
  if len(idle):
    raise InputError(
      f"{path}: {ck} columns {', '.join(map(str, idle[:5]))} carry no current (all zero): a "
      "pattern measures nothing without one; remove them, or leave them out with --patterns"
    )
  rows = np.array([(p, plus[m], minus[m]) for p in range(len(keep)) for m in range(num_m)])
  return DeviceFile(path, d, fmt, ck, inj, mk, np.stack([plus, minus], 1), keep, rows, scale)


# KTC2023's four repeated patterns agree to 0.1 %; distinct ones differ by over 70 %
REPEAT_TOLERANCE = 0.05


def _check_repeats(path: str, vk: str, currents, mk: str, pairs, v: np.ndarray) -> None:
  """Refuse a file whose repeated current patterns (`currents`: (key, (P, E))) or repeated
  measured pairs (`mk`, `pairs` (M, 2)) disagree in their values `v` (P, M) by more than
  REPEAT_TOLERANCE: the same currents, or the same pair, measured twice give the same values up
  to noise (KTC2023's own repeated patterns agree to 0.1 %), so one of them is not the pattern or
  pair its values were measured with. A pair repeated in reverse measures the negative."""
  ck, inj = currents
  cases = [
    (ck, "currents", "pattern", [(tuple(c), 1.0) for c in inj], v),
    (mk, "pair", "pair", [((min(a, b), max(a, b)), 1.0 if a < b else -1.0) for a, b in pairs], v.T),
  ]
  for key, same, one, rows, values in cases:
    seen: dict[tuple, tuple[int, float]] = {}
    for j, (row, sign) in enumerate(rows):
      first, first_sign = seen.setdefault(row, (j, sign))
      if first == j:
        continue
      a, b = first_sign * values[first], sign * values[j]
      both = np.isfinite(a) & np.isfinite(b)
      size = np.linalg.norm(a[both])
      gap = np.linalg.norm(a[both] - b[both]) / size if size > 0 else 0.0
      if gap > REPEAT_TOLERANCE:
        raise InputError(
          f"{path}: {key} columns {first} and {j} are the same {same}, yet their values in "
          f"{vk} differ by {100 * gap:.0f} % (a repeat agrees to noise): one of them is not the "
          f"{one} it was measured with; correct the file"
        )


# A calibrated device file's own keys beside KTC's (`save_device`).
DEVICE_KEYS = ("angles_deg", "width_deg", "gain", "contact_impedance", "current_ratio")
NAME_KEY = "device_name"  # the device's own name (e.g. "ref.mat (UEF keys)"), not the copy's


def _patterns(path: str, key: str, patterns, num_p: int) -> np.ndarray:
  """The pattern columns `patterns` selects: indices, or text such as "0-15,32"."""
  try:
    if isinstance(patterns, str):
      out = []
      for part in patterns.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    else:
      out = [int(p) for p in np.asarray(patterns).reshape(-1)]
  except ValueError:
    out = []
  if not out or len(set(out)) != len(out) or min(out) < 0 or max(out) >= num_p:
    raise InputError(
      f"{path}: patterns {patterns!r}: give distinct columns of {key} from 0 to {num_p - 1}, "
      "e.g. '0-15'"
    )
  return np.asarray(out)


# A calibrated device file's ranges of the values its frame allows (`eit.calibration`), which
# configs/device.py trains across: name -> (low, high).
RANGE_KEYS = {"width_deg": "width_range_deg", "contact_impedance": "contact_impedance_range"}


def save_device(
  path: str, layout, reference: np.ndarray | None = None, ranges: dict | None = None
) -> None:
  """Write `layout` (an `eit.layout.Layout`, calibrated or not) as a device file in KTC's keys
  with its own geometry and calibration (`DEVICE_KEYS`), which `eit.layout.from_device_file`
  reads back as the same device; the reference frame as `Uelref`; `ranges` (the calibration's,
  `RANGE_KEYS`). Every pattern must measure the same pairs (one `Mpat`)."""
  first = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  pairs = np.tile(first, (layout.num_patterns, 1))
  if len(pairs) != layout.num_values or not np.array_equal(pairs, layout.rows[:, 1:]):
    raise InputError(f"{layout.describe()}: its patterns measure different pairs; no Mpat holds it")
  mpat = np.zeros((layout.num_electrodes, len(first)))
  mpat[first[:, 0], np.arange(len(first))] = 1.0
  mpat[first[:, 1], np.arange(len(first))] = -1.0
  arrays = {
    "Injref": layout.currents,
    "Mpat": mpat,
    "angles_deg": np.rad2deg(layout.angles),
    "width_deg": np.float64(np.rad2deg(layout.width)),
    "gain": np.float64(layout.gain),
    "current_ratio": np.float64(layout.current_ratio),
    NAME_KEY: np.array(layout.name),
  }
  if layout.contact_impedance is not None:
    arrays["contact_impedance"] = np.float64(layout.contact_impedance)
  if reference is not None:
    arrays["Uelref"] = np.asarray(reference, np.float64)[:, None]
  for name, (lo, hi) in (ranges or {}).items():
    arrays[RANGE_KEYS[name]] = np.array([lo, hi], np.float64)

  def write(tmp):
    with open(tmp, "wb") as fh:  # a handle: np.savez would append ".npz" to the temporary name
      np.savez(fh, **arrays)

  fileio.atomic_write(path, write, ours=is_saved_device, what=SAVED)


SAVED = "a device file (python -m cdeit_jax.calibrate)"


def is_saved_device(path: str) -> bool:
  """Whether `path` is a device file `save_device` wrote (its own keys), which it replaces."""
  try:
    got = fileio.load_npz(path, [NAME_KEY, *DEVICE_KEYS[:3]])
  except (OSError, ValueError, EOFError, zipfile.BadZipFile):
    return False
  return {NAME_KEY, *DEVICE_KEYS[:3]} <= set(got)


def _frame_values(path: str, key: str, v: np.ndarray, num_p: int, num_m: int) -> np.ndarray:
  """A device file's frame (R,) pattern by pattern: the values in one row or column, or a
  matrix of one column per pattern (num_m, num_p), in either key convention; other shapes
  are refused (a matrix of one row per pattern would be read in the wrong order)."""
  r = num_p * num_m
  if v.ndim == 2 and v.shape == (num_m, num_p) and 1 not in v.shape:
    return v.T.reshape(-1)  # one column per pattern -> pattern by pattern
  if v.ndim <= 2 and v.size == r and (v.ndim < 2 or 1 in v.shape):
    return v.reshape(-1)
  raise InputError(
    f"{path}: {key} {v.shape} is not one frame of these patterns: give the {r} values in one "
    f"column, pattern by pattern, or one column per pattern ({num_m}, {num_p})"
  )
