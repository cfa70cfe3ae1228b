"""The measuring system's electrodes and patterns, for any 2-D EIT device: one object that the
forward model, the linearised reconstruction and the data readers read.

A `Layout` holds
- the electrodes: count, centre angles (radians, counter-clockwise from +x in the image's frame,
  where the image's row index grows with +y, docs/reference/eit-conventions.md) and angular width;
- the injections: a current matrix (electrodes, patterns), in units of the nominal current (the
  forward model multiplies it by its `current`), "+" = into the body;
- the measurements: one row (pattern, electrode +, electrode -) per value, in the data's order, so
  value r is U[plus_r] - U[minus_r] under pattern r. Devices that measure on current-carrying
  electrodes (KTC2023, Sciospec) simply list those pairs.

Build one from rules (`from_rules`: adjacent, skip-k, opposite, against-k injections; adjacent or
skip-k measurements, with or without current-carrying electrodes), from a preset (`preset`:
"cdeit16", CDEIT's 16-electrode system, adjacent injections and measurements: 208 values;
"uef2017", the same in the UEF2017 tank's units; and "ktc2023"), from
a device's reference file (`from_device_file`: `.mat`/`.npz` with KTC's keys `Inj`/`Injref`,
`Mpat`, `Uel`/`Uelref`, or UEF's `CurrentPattern`, `MeasPattern`, `Uel`). Missing values (a
removed electrode) are NaN in a frame, never part of the layout: `present` tells which rows a
frame has. The tank's turns and mirror as permutations of a device's values are `eit.turns`.

A `Layout` is the one measuring-system value: it also holds the device's units (`gain`,
`current_ratio`) and its contact impedance (`z`), and the simulator, the forward model, the
Jacobian, the Tikhonov baseline, the conditioning and the checkpoint all take it. Two layouts are
equal when every field is; `physics` is what the forward model depends on (no name, no units),
the key of the per-system caches.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import numbers
import os
import re

import numpy as np

from cdeit_jax.common import array_files, fileio
from cdeit_jax.common.errors import InputError

# KTC2023's tank: 32 electrodes numbered counter-clockwise, electrode 0 centred 84.375 degrees
# from +x, 5.625 degrees wide (the organisers' Mesh_sparse.mat: `elfaces` and its nodes).
KTC_FIRST_DEG, KTC_WIDTH_DEG = 84.375, 5.625
CDEIT_WIDTH_DEG = 4.0  # the CDEIT simulations' electrodes (docs/reference/eit-conventions.md)
CONTACT_IMPEDANCE = 0.01  # the simulated system's contact impedance (reference conventions)
CURRENT = 1e-3  # the injected current (A) of the simulation units: `currents` are relative to it


def spacing(angles: np.ndarray) -> float:
  """The narrowest angle (radians) between two neighbouring electrode centres."""
  a = np.sort(np.mod(np.asarray(angles, np.float64), 2 * np.pi))
  return float(np.diff(a, append=a[0] + 2 * np.pi).min())


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
  """Electrodes and patterns, units and contact impedance (module docstring). Arrays are
  read-only numpy arrays; equal and hashable by value."""

  name: str
  angles: np.ndarray  # (E,) electrode centres, radians
  width: float  # angular width, radians
  currents: np.ndarray  # (E, P) relative currents, "+" into the body
  rows: np.ndarray  # (R, 3) int32: pattern, electrode +, electrode -
  # the device's units: measured / simulated volts (a preset's, or fitted by `eit.calibration`)
  # and measured / simulated current; the contact impedance in simulator units (None: not
  # calibrated; the config's value holds)
  gain: float = 1.0
  contact_impedance: float | None = None
  current_ratio: float = 1.0

  def __post_init__(self):
    e = len(self.angles)
    cur, rows = np.asarray(self.currents, np.float64), np.asarray(self.rows, np.int32)
    if cur.ndim != 2 or cur.shape[0] != e:
      raise InputError(f"layout {self.name}: currents must be (electrodes={e}, patterns)")
    if rows.ndim != 2 or rows.shape[1] != 3 or len(rows) == 0:
      raise InputError(f"layout {self.name}: rows must be (values, 3): pattern, plus, minus")
    if rows[:, 0].min() < 0 or rows[:, 0].max() >= cur.shape[1]:
      raise InputError(f"layout {self.name}: a row names a pattern outside 0..{cur.shape[1] - 1}")
    if rows[:, 1:].min() < 0 or rows[:, 1:].max() >= e or np.any(rows[:, 1] == rows[:, 2]):
      raise InputError(f"layout {self.name}: a row's electrodes are outside 0..{e - 1} or equal")
    if np.any(np.abs(cur.sum(0)) > 1e-9 * np.abs(cur).max(0).clip(1e-300)):
      raise InputError(f"layout {self.name}: each pattern's currents must sum to zero")
    angles = np.asarray(self.angles, np.float64)
    if e < 4 or angles.shape != (e,) or not np.all(np.isfinite(angles)):
      raise InputError(f"layout {self.name}: needs 4 or more electrodes at finite angles")
    for what in ("gain", "current_ratio"):
      v = getattr(self, what)
      if isinstance(v, bool) or not (isinstance(v, numbers.Real) and 0 < v < float("inf")):
        raise InputError(f"layout {self.name}: {what} {v!r} must be a positive number")
    z = self.contact_impedance
    if z is not None and not (isinstance(z, numbers.Real) and 0 < z < float("inf")):
      raise InputError(f"layout {self.name}: contact impedance {z!r} must be a positive number")
    width = self.width if isinstance(self.width, numbers.Real) else float("nan")
    if not 0 < width < spacing(angles):
      raise InputError(
        f"layout {self.name}: electrode width {float(np.rad2deg(width)):.4g} degrees must be > 0 "
        f"and below the narrowest gap between centres ({np.rad2deg(spacing(angles)):.4g} degrees)"
      )
    for name, value in (("angles", self.angles), ("currents", cur), ("rows", rows)):
      value = np.array(value, np.float64 if name != "rows" else np.int32)
      value.setflags(write=False)
      object.__setattr__(self, name, value)

  def _fields(self) -> tuple:
    return (
      self.name,
      self.angles.tobytes(),
      float(self.width),
      self.currents.tobytes(),
      self.rows.tobytes(),
      float(self.gain),
      self.contact_impedance,
      float(self.current_ratio),
    )

  def __eq__(self, other) -> bool:
    return isinstance(other, Layout) and self._fields() == other._fields()

  def __hash__(self) -> int:
    return hash(self._fields())

  @property
  def z(self) -> float:
    """The contact impedance the physics uses: the device's, else the simulations' nominal."""
    return CONTACT_IMPEDANCE if self.contact_impedance is None else float(self.contact_impedance)

  @functools.cached_property
  def physics(self) -> Layout:
    """This system as the forward model sees it: no name, simulation units, its contact
    impedance spelled out (layouts that measure alike share one, the caches' key)."""
    return Layout(
      "", self.angles, float(self.width), self.currents, self.rows, contact_impedance=self.z
    )

  @property
  def conductivity_factor(self) -> float:
    """Label units -> the device's conductivity units (its current ratio over its gain)."""
    return float(self.current_ratio) / float(self.gain)

  def in_units(self, name: str, gain: float, current_ratio: float) -> Layout:
    """This device as data in other units are (`measurement.in_units`): the same electrodes,
    patterns and contact impedance, named for the units, with their voltage ratio (`gain`,
    measured / simulated volts) and current ratio."""
    return dataclasses.replace(self, name=name, gain=gain, current_ratio=current_ratio)

  def with_contact_impedance(self, z: float | None) -> Layout:
    """This device with contact impedance `z` (None: itself)."""
    return self if z is None else dataclasses.replace(self, contact_impedance=float(z))

  @functools.cached_property
  def pattern_table(self) -> np.ndarray | None:
    """(patterns, values per pattern) row indices when every pattern measures as many values
    in pattern order (CDEIT's 16 x 13: the authors' statistics' shape), else None."""
    p = self.rows[:, 0]
    counts = np.bincount(p, minlength=self.num_patterns)
    if counts.min() != counts.max() or np.any(np.diff(p) < 0):
      return None
    out = np.arange(self.num_values).reshape(self.num_patterns, counts[0])
    out.setflags(write=False)
    return out

  @property
  def num_electrodes(self) -> int:
    return len(self.angles)

  @property
  def num_patterns(self) -> int:
    return self.currents.shape[1]

  @property
  def num_values(self) -> int:
    return len(self.rows)

  @functools.cached_property
  def signature(self) -> str:
    """A short hash of the system's shape (angles to 1e-6 rad, width, which electrodes carry
    current in which direction, rows; not the currents' amplitudes, which a device's calibration
    holds): two devices with one signature measure the same values."""
    h = hashlib.sha256()
    for a in (np.round(self.angles, 6), np.round(self.width, 6), np.sign(self.currents)):
      h.update(np.ascontiguousarray(a).tobytes())
    h.update(np.ascontiguousarray(self.rows).tobytes())
    return h.hexdigest()[:16]

  def measures_as(self, other: Layout) -> bool:
    """Whether `other` measures the same values in the same order as this device (its
    electrodes, current directions and rows), whatever either's geometry or calibration: data
    of one fit a model of the other (a device and its calibration)."""
    return (
      self.num_electrodes == other.num_electrodes
      and np.array_equal(np.sign(self.currents), np.sign(other.currents))
      and np.array_equal(self.rows, other.rows)
    )

  def same_system(self, other: Layout) -> bool:
    """Whether `other` is this system as a model was trained for it: the same signature and the
    same currents (a checkpoint's kept device against a config's)."""
    return self.signature == other.signature and np.array_equal(self.currents, other.currents)

  def record(self) -> dict:
    """The layout as JSON-able arrays (a checkpoint keeps it: the model needs no device file)."""
    return {
      "name": self.name,
      "angles": self.angles.tolist(),
      "width": float(self.width),
      "currents": self.currents.tolist(),
      "rows": self.rows.tolist(),
      "gain": float(self.gain),
      "contact_impedance": self.contact_impedance,
      "current_ratio": float(self.current_ratio),
    }

  @classmethod
  def from_record(cls, record: dict, where: str = "the stored measuring system") -> Layout:
    """`record`'s layout; an InputError naming `where` when it is not one."""
    try:
      return cls(
        str(record["name"]),
        np.asarray(record["angles"], np.float64),
        float(record["width"]),
        np.asarray(record["currents"], np.float64),
        np.asarray(record["rows"], np.int64),
        float(record.get("gain", 1.0)),
        None if record.get("contact_impedance") is None else float(record["contact_impedance"]),
        float(record.get("current_ratio", 1.0)),
      )
    except (KeyError, TypeError, ValueError) as e:
      raise InputError(
        f"{where}: not a measuring system ({' '.join(str(e).split())[:160]})"
      ) from None

  def describe(self) -> str:
    return (
      f"{self.name} ({self.num_electrodes} electrodes, {self.num_patterns} patterns"
      f"{', ' + self.injections if self.injections else ''}, {self.num_values} values)"
    )

  @functools.cached_property
  def injections(self) -> str:
    """The current patterns in words when they follow one rule ("skip 1": each between
    electrodes l and l + 2; "adjacent"; "all against electrode 0"), else "" (two devices of one
    tank differ in this, where their names, a file's, may not)."""
    pos, neg = np.argmax(self.currents, axis=0), np.argmin(self.currents, axis=0)
    pairs = np.count_nonzero(self.currents, axis=0) == 2
    if not pairs.all() or self.num_patterns < 2:
      return ""
    if len(set(neg.tolist())) == 1:
      return f"all against electrode {int(neg[0])}"
    d = (neg - pos) % self.num_electrodes
    skips = set((np.minimum(d, self.num_electrodes - d) - 1).tolist())  # either way round
    if len(skips) == 1:
      k = skips.pop()
      return "adjacent" if k == 0 else f"skip {k}"
    return ""

  def measure(self, potentials):
    """The values (..., R) of electrode potentials (..., E, P) (numpy or jax)."""
    p, a, b = self.rows[:, 0], self.rows[:, 1], self.rows[:, 2]
    return potentials[..., a, p] - potentials[..., b, p]

  def present(self, frame: np.ndarray) -> np.ndarray:
    """(R,) bool: the finite values of a frame (R,) (NaN: removed by the device or the user)."""
    frame = np.asarray(frame)
    if frame.shape[-1] != self.num_values:
      raise InputError(
        f"a frame of {frame.shape[-1]} values does not fit {self.describe()}: give data of "
        "this measuring system"
      )
    return np.isfinite(frame)

  def electrode_mask(self, electrodes) -> np.ndarray:
    """(E,) bool of `electrodes`: numbers 0..E-1, or a boolean mask of the E electrodes; any
    other value (negative, fractional, beyond E) is an InputError."""
    e = self.num_electrodes
    a = np.asarray(electrodes)
    if a.dtype == bool:
      if a.shape != (e,):
        raise InputError(f"a mask of removed electrodes must have {e} entries, got {a.shape}")
      return a.copy()
    if a.size and (
      a.dtype.kind not in "iuf" or np.any(a != np.round(a)) or a.min() < 0 or a.max() >= e
    ):
      raise InputError(
        f"electrodes {a.tolist()!r}: give electrode numbers from 0 to {e - 1} ({self.describe()})"
      )
    gone = np.zeros(e, bool)
    gone[a.astype(int).reshape(-1)] = True
    return gone

  @property
  def on_current_carrying(self) -> np.ndarray:
    """(R,) bool: the values measured on an electrode that carries current in their pattern
    (none in CDEIT's 208; 64 of 256 in UEF2017's skip patterns). They hold the contact
    impedance's voltage drop, which the electrode model fits least well."""
    p, a, b = self.rows.T
    return (self.currents[a, p] != 0) | (self.currents[b, p] != 0)

  def without(self, electrodes) -> np.ndarray:
    """(R,) bool: the values a device loses when `electrodes` are removed: every pair that
    touches one, and every pattern that drives current through one (KTC2023's levels: level K
    removes electrodes 0 .. 2K-3, tests/test_layout.py)."""
    gone = self.electrode_mask(electrodes)
    driven = (self.currents != 0)[gone].any(0)  # (P,) patterns through a removed electrode
    p, a, b = self.rows.T
    return gone[a] | gone[b] | driven[p]


def _default_width(n: int) -> float:
  """Degrees: CDEIT's 4 for 16 electrodes, else half the spacing."""
  return CDEIT_WIDTH_DEG if n == 16 else 180.0 / n


def evenly_spaced(n: int, first_deg: float = 90.0, clockwise: bool = True) -> np.ndarray:
  """Centres (radians) of `n` evenly spaced electrodes, electrode 0 at `first_deg`."""
  step = -2 * np.pi / n if clockwise else 2 * np.pi / n
  return np.deg2rad(first_deg) + step * np.arange(n)


_SKIP = re.compile(r"^skip-(\d+)$")
_AGAINST = re.compile(r"^against-(\d+)$")


def _injection_pairs(n: int, rule: str) -> list[tuple[int, int]]:
  """(electrode with -I, electrode with +I) per pattern, CDEIT's sign for the skip rules."""
  if rule == "adjacent":
    rule = "skip-0"
  if rule == "opposite":
    if n % 2:
      raise InputError(f"injection 'opposite' needs an even electrode count, got {n}")
    rule = f"skip-{n // 2 - 1}"
  if m := _SKIP.match(rule):
    s = int(m.group(1))
    if not 0 <= s <= n - 2:
      raise InputError(f"injection {rule!r}: the skip must be in 0..{n - 2} for {n} electrodes")
    return [(k, (k + s + 1) % n) for k in range(n)]
  if m := _AGAINST.match(rule):
    ref = int(m.group(1))
    if not 0 <= ref < n:
      raise InputError(f"injection {rule!r}: the electrode must be in 0..{n - 1}")
    return [(ref, k) for k in range(n) if k != ref]
  raise InputError(
    f"injection {rule!r}: use 'adjacent', 'opposite', 'skip-K' or 'against-K' (K an electrode)"
  )


def from_rules(
  num_electrodes: int = 16,
  injection: str = "adjacent",
  measurement: str = "adjacent",
  measure_injecting: bool = False,
  first_deg: float = 90.0,
  clockwise: bool = True,
  width_deg: float | None = None,
  name: str | None = None,
) -> Layout:
  """A ring of `num_electrodes` electrodes with pyEIT-like rules. Injection pattern k drives
  -1 at its first electrode and +1 at its second; measurement m of each pattern is
  U_m - U_{m+1+skip} for m = 0..E-1, leaving out pairs that touch a current-carrying electrode
  unless `measure_injecting` (the EIDORS/CDEIT convention: 16 electrodes, adjacent: 208 values).
  `width_deg`: 4 for 16 electrodes (CDEIT's), else half the spacing."""
  n = num_electrodes
  if not (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 4):
    raise InputError(f"num_electrodes={n!r} must be an integer >= 4")
  n = int(n)
  for what, rule in (("injection", injection), ("measurement", measurement)):
    if not isinstance(rule, str):
      raise InputError(f"{what}={rule!r}: give a rule's name, e.g. 'adjacent' or 'skip-2'")
  m = _SKIP.match("skip-0" if measurement == "adjacent" else measurement)
  if not m or not 0 <= int(m.group(1)) <= n - 2:
    raise InputError(f"measurement {measurement!r}: use 'adjacent' or 'skip-K', K in 0..{n - 2}")
  ms = int(m.group(1)) + 1
  pairs = _injection_pairs(n, injection)
  currents = np.zeros((n, len(pairs)))
  rows = []
  for p, (lo, hi) in enumerate(pairs):
    currents[lo, p], currents[hi, p] = -1.0, 1.0
    for e in range(n):
      pair = {e, (e + ms) % n}
      if measure_injecting or not pair & {lo, hi}:
        rows.append((p, e, (e + ms) % n))
    if not rows or rows[-1][0] != p:
      raise InputError(
        f"{n} electrodes, {injection} injection, {measurement} measurement: pattern {p} "
        "measures nothing (every pair touches a current-carrying electrode); measure on them "
        "too (measure_injecting=True) or choose other rules"
      )
  if width_deg is None:
    width_deg = _default_width(n)
  label = name or f"{n} electrodes, {injection} injection, {measurement} measurement" + (
    ", current-carrying electrodes measured" if measure_injecting else ""
  )
  return Layout(
    label, evenly_spaced(n, first_deg, clockwise), np.deg2rad(width_deg), currents, np.array(rows)
  )


def ktc2023() -> Layout:
  """KTC2023's system: 32 electrodes counter-clockwise, currents through the 16 even (0-based)
  ones: 16 skip-1 pairs (+ at 2p, - at 2p+2) and 15 patterns against each of electrodes 0, 8, 16,
  24 (+ at the other, - at it); each pattern measures U_m - U_{m+1}, m = 0..30 (2,356 values)."""
  n, odd = 32, list(range(0, 32, 2))
  pairs = [(2 * p, (2 * p + 2) % n) for p in range(16)]
  pairs += [(e, ref) for ref in (0, 8, 16, 24) for e in odd if e != ref]
  currents = np.zeros((n, len(pairs)))
  for p, (plus, minus) in enumerate(pairs):
    currents[plus, p], currents[minus, p] = 1.0, -1.0
  rows = np.array([(p, m, m + 1) for p in range(len(pairs)) for m in range(n - 1)])
  angles = evenly_spaced(n, KTC_FIRST_DEG, clockwise=False)
  gain, current = KTC2023_UNITS
  return Layout(
    "ktc2023", angles, np.deg2rad(KTC_WIDTH_DEG), currents, rows, gain, current_ratio=current
  )


def _uef2017() -> Layout:
  """The UEF2017 tank as CDEIT's authors measured it: CDEIT's 16 electrodes and patterns, in the
  tank's units (the reference document's voltage and current ratios)."""
  return dataclasses.replace(
    from_rules(16, name="uef2017"), gain=UEF2017_UNITS[0], current_ratio=UEF2017_UNITS[1]
  )


# The one table of named measuring systems (the units of a data set named so too, with
# "simulated" for the simulator's own): electrodes, patterns and the device's units. cdeit16 is
# in simulation units; uef2017 and ktc2023 in their tanks' (measured / simulated volts, current).
UEF2017_UNITS, KTC2023_UNITS = (1040.856, 2.0), (1978.0, 2.0)
PRESETS = {
  "cdeit16": lambda: from_rules(16, name="cdeit16"),
  "uef2017": _uef2017,
  "ktc2023": ktc2023,
}

# Electrode-removal rules: the sets of removed electrodes a model is trained and used with, one
# drawn per training example. "ktc2023": the challenge's 7 levels (level K removes electrodes
# 0 .. 2K-3, `Layout.without` reproduces every public level's NaN mask).
REMOVALS = {"none": ((),), "ktc2023": tuple(tuple(range(2 * (k - 1))) for k in range(1, 8))}


def removal_sets(rule: str | None) -> tuple[tuple[int, ...], ...]:
  """The electrode sets of a removal rule: "none" (or None), "ktc2023", or the sets written
  out, `;` between sets, `,` between electrodes, `-` for none removed (e.g. "-;3;3,4")."""
  if rule is None:
    return REMOVALS["none"]
  if rule in REMOVALS:
    return REMOVALS[rule]
  try:
    sets = tuple(
      () if part.strip() == "-" else tuple(sorted({int(e) for e in part.split(",")}))
      for part in str(rule).split(";")
    )
  except ValueError:
    sets = ()
  if not sets or len(set(sets)) != len(sets) or any(e < 0 for s in sets for e in s):
    raise InputError(
      f"electrode removal {rule!r}: give {' or '.join(sorted(REMOVALS))}, or distinct sets of "
      "electrode numbers (from 0) such as '-;3;3,4' ('-': none removed) "
      "(config.simulator.removals)"
    )
  return sets


def as_layout(system: str | Layout) -> Layout:
  """A layout as it is, or a preset's name or device file resolved (`resolve`)."""
  return system if isinstance(system, Layout) else resolve(system)


def resolve(name: str) -> Layout:
  """A preset's name or a device's reference file (`from_device_file`) as a layout."""
  if name in PRESETS:
    return preset(name)
  if str(name).lower().endswith((".mat", ".npz")):
    return from_device_file(name)[0]
  raise InputError(
    f"measuring system {name!r}: give a preset ({', '.join(sorted(PRESETS))}) or a device's "
    "reference file (.mat or .npz; docs/ktc2023.md) (config.simulator.layout)"
  )


@functools.lru_cache(maxsize=8)
def preset(name: str) -> Layout:
  """A named measuring system (`PRESETS`): "cdeit16" (CDEIT's 208 values),
  "uef2017" (the same in the UEF2017 tank's units) or "ktc2023"."""
  if name not in PRESETS:
    raise InputError(f"measuring system {name!r}: known presets are {sorted(PRESETS)}")
  return PRESETS[name]()


def frames_shape_error(
  where: str, shape: tuple[int, ...], m: int, system: str | None = None
) -> InputError:
  """The one refusal of frames that are not rows of `m` values (of the measuring system
  `system`, where one reads them), naming the presets whose system measures as many values as
  the frames hold (another device's frames)."""
  n = shape[-1] if shape else 0
  shapes = {}  # one name per system's shape (uef2017 is cdeit16 in other units)
  for k in PRESETS:
    shapes.setdefault(preset(k).signature, preset(k))
  names = [lay.describe() for lay in shapes.values() if lay.num_values == n]
  fits = f" ({n} values: as {' or '.join(names)}; see docs/ktc2023.md)" if names else ""
  reader = f" of {system}, the model's system," if system else ""
  return InputError(
    f"{where}: frames must be rows of {m} voltages{reader} (N, {m}) in the protocol's order, "
    f"got shape {shape}{fits}"
  )


@dataclasses.dataclass(frozen=True)
class DeviceFormat:
  """A vendor's keys in a device file (`.mat`/`.npz`, read by `common.array_files`): each a
  tuple of names, the first present is taken; and how its electrodes are numbered."""

  name: str
  currents: tuple[str, ...]  # (E, P): the current patterns
  pattern: tuple[str, ...]  # (E, M): the measured pairs, one +1 and one -1 each
  values: tuple[str, ...]  # the empty tank's values, pattern by pattern or (M, P)
  clockwise: bool  # electrode numbers grow clockwise (from the top)


# The registry of device-file formats, in the order they are tried (`device_format`): a new
# vendor's keys are one more entry (`register_device_format`) and a test.
DEVICE_FORMATS: dict[str, DeviceFormat] = {}


def register_device_format(fmt: DeviceFormat) -> DeviceFormat:
  DEVICE_FORMATS[fmt.name] = fmt
  return fmt


register_device_format(DeviceFormat("KTC", ("Injref", "Inj"), ("Mpat",), ("Uelref", "Uel"), False))
register_device_format(DeviceFormat("UEF", ("CurrentPattern",), ("MeasPattern",), ("Uel",), True))


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
    f"{f.name}'s keys {' or '.join(f.currents)}, {' or '.join(f.pattern)} (and "
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


def from_device_file(
  path: str,
  first_deg: float | None = None,
  clockwise: bool | None = None,
  width_deg: float | None = None,
  patterns=None,
) -> tuple[Layout, np.ndarray | None]:
  """(layout, the file's values (R,) in the layout's order, or None) of a device's reference
  file. KTC's keys (`Inj`/`Injref` (E, P), `Mpat` (E, M), `Uel`/`Uelref`) or UEF's
  (`CurrentPattern` (E, P), `MeasPattern` (E, M), `Uel`); the values in either are (M*P, 1)
  pattern by pattern or (M, P), one column per pattern (`_frame_values`); measurement column m
  of pattern p is `Mpat[:, m] . U`, one +1 and one -1 each. Complex, non-finite (NaN values:
  missing) or non-numeric arrays, and fewer than 4 electrodes, are refused in one line.
  Electrodes are evenly spaced from `first_deg` (default: the top, or KTC2023's tank geometry
  for KTC's keys with 32 electrodes), numbered counter-clockwise for KTC's keys and clockwise for
  UEF's unless `clockwise` says; currents are relative to the largest. A calibrated device file
  (`save_device`) also holds `angles_deg`, `width_deg`, `gain`, `contact_impedance` and
  `current_ratio`, which hold unless an argument says otherwise. `patterns`: the current
  patterns (columns) to keep, for a file of several protocols (UEF2017's 79 patterns)."""
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
  placed = first_deg is not None or clockwise is not None  # the caller's geometry
  cw = fmt.clockwise if clockwise is None else clockwise
  ktc_tank = fmt.name == "KTC" and n == 32
  if first_deg is None:
    first_deg = KTC_FIRST_DEG if ktc_tank else 90.0
  angles = evenly_spaced(n, first_deg, cw)
  given = {k: _numbers(path, k, d[k]) for k in DEVICE_KEYS if k in d}
  if "angles_deg" in given and not placed:
    angles = np.deg2rad(given["angles_deg"].reshape(-1))
  if width_deg is None:
    width_deg = float(given["width_deg"].reshape(-1)[0]) if "width_deg" in given else None
  if width_deg is None:
    width_deg = KTC_WIDTH_DEG if ktc_tank else _default_width(n)
  name = f"{os.path.basename(path)} ({fmt.name} keys)"
  if NAME_KEY in d:  # a calibrated device file keeps its reference file's name
    name = str(np.asarray(d[NAME_KEY]).reshape(-1)[0])
  cal = {k: float(given[k].reshape(-1)[0]) for k in DEVICE_KEYS[2:] if k in given}
  layout = Layout(name, angles, np.deg2rad(width_deg), inj[:, keep] / scale, rows, **cal)
  if layout.signature == preset("ktc2023").signature:
    layout = dataclasses.replace(layout, name=f"ktc2023 ({os.path.basename(path)})")
  values = _first(d, fmt.values)
  if values is None:
    return layout, None
  vk, v = values
  v = _frame_values(path, vk, _numbers(path, vk, v, missing_ok=True), num_p, num_m)
  v = v.reshape(num_p, num_m)[keep]
  _check_repeats(path, vk, (ck, inj[:, keep].T), mk, np.stack([plus, minus], 1), v)
  return layout, v.reshape(-1)


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
  path: str, layout: Layout, reference: np.ndarray | None = None, ranges: dict | None = None
) -> None:
  """Write `layout` (calibrated or not) as a device file in KTC's keys with its own geometry and
  calibration (`DEVICE_KEYS`), which `from_device_file` reads back as the same device; the
  reference frame as `Uelref`; `ranges` (the calibration's, `RANGE_KEYS`). Every pattern must
  measure the same pairs (one `Mpat`)."""
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

  fileio.atomic_write(path, write)


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
