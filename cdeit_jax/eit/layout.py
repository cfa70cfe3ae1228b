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
skip-k measurements, with or without current-carrying electrodes; their arrays are
`eit.pattern_rules`), from a preset (`preset`: "cdeit16", CDEIT's 16-electrode system, adjacent
injections and measurements: 208 values; "uef2017", the same in the UEF2017 tank's units; and
"ktc2023"), from a device's reference file (`from_device_file`: `.mat`/`.npz` with KTC's keys
`Inj`/`Injref`, `Mpat`, `Uel`/`Uelref`, or UEF's `CurrentPattern`, `MeasPattern`, `Uel`; their
formats, reading and writing are `eit.device_files`). Missing values (a removed electrode) are
NaN in a frame, never part of the layout: `present` tells which rows a frame has. The tank's
turns and mirror as permutations of a device's values are `eit.turns`.

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

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files, pattern_rules

# KTC2023's tank: 32 electrodes numbered counter-clockwise, 5.625 degrees wide. The organisers'
# Mesh_sparse.mat centres electrode 0 at 84.375 degrees from +x (the `ktc2023` preset, which the
# shipped model was trained on); its files' frames put it at the top, 90 degrees (the challenge's
# own words, "counter-clockwise from the top"): the public targets' frames fit their truths best
# with the electrodes 5.0-6.2 degrees counter-clockwise of the mesh's (docs/ktc2023.md, "Where
# the electrodes meet the answers' grid"). A model's answers are turned by the difference
# (`turns.offset`).
KTC_MESH_FIRST_DEG, KTC_FIRST_DEG, KTC_WIDTH_DEG = 84.375, 90.0, 5.625
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
  currents, rows = pattern_rules.rule_patterns(n, injection, measurement, measure_injecting)
  if width_deg is None:
    width_deg = pattern_rules.default_width(n)
  label = name or f"{n} electrodes, {injection} injection, {measurement} measurement" + (
    ", current-carrying electrodes measured" if measure_injecting else ""
  )
  angles = pattern_rules.evenly_spaced(n, first_deg, clockwise)
  return Layout(label, angles, np.deg2rad(width_deg), currents, rows)


def ktc2023() -> Layout:
  """KTC2023's system: 32 electrodes counter-clockwise as the organisers' mesh places them
  (the tank's own files turn them by half a spacing: `KTC_FIRST_DEG`), its 76 patterns
  (`pattern_rules.ktc2023_patterns`: 16 skip-1 pairs and 15 against each of electrodes 0, 8, 16,
  24; each measures U_m - U_{m+1}, m = 0..30: 2,356 values), in its tank's units."""
  currents, rows = pattern_rules.ktc2023_patterns()
  angles = pattern_rules.evenly_spaced(32, KTC_MESH_FIRST_DEG, clockwise=False)
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


def from_device_file(
  path: str,
  first_deg: float | None = None,
  clockwise: bool | None = None,
  width_deg: float | None = None,
  patterns=None,
) -> tuple[Layout, np.ndarray | None]:
  """(layout, the file's values (R,) in the layout's order, or None) of a device's reference
  file (its keys, and what is refused in one line: `device_files.read`). Electrodes are evenly
  spaced from `first_deg` (default: the top, or KTC2023's tank geometry for KTC's keys with 32
  electrodes), numbered counter-clockwise for KTC's keys and clockwise for UEF's unless
  `clockwise` says; currents are relative to the largest. A calibrated device file
  (`device_files.save_device`) also holds `angles_deg`, `width_deg`, `gain`,
  `contact_impedance` and `current_ratio`, which hold unless an argument says otherwise.
  `patterns`: the current patterns (columns) to keep, for a file of several protocols (UEF2017's
  79 patterns)."""
  f = device_files.read(path, patterns)
  n = f.num_electrodes
  placed = first_deg is not None or clockwise is not None  # the caller's geometry
  cw = f.format.clockwise if clockwise is None else clockwise
  ktc_tank = f.format.name == "KTC" and n == 32
  if first_deg is None:
    first_deg = KTC_FIRST_DEG if ktc_tank else 90.0
  angles = pattern_rules.evenly_spaced(n, first_deg, cw)
  given = f.given
  if "angles_deg" in given and not placed:
    angles = np.deg2rad(given["angles_deg"].reshape(-1))
  if width_deg is None:
    width_deg = float(given["width_deg"].reshape(-1)[0]) if "width_deg" in given else None
  if width_deg is None:
    width_deg = KTC_WIDTH_DEG if ktc_tank else pattern_rules.default_width(n)
  name, currents = f.name, f.relative_currents
  layout = Layout(name, angles, np.deg2rad(width_deg), currents, f.rows, **f.calibration)
  ktc = preset("ktc2023")
  if layout.measures_as(ktc) and np.isclose(float(layout.width), float(ktc.width)):
    layout = dataclasses.replace(layout, name=f"ktc2023 ({os.path.basename(path)})")
  return layout, f.frame()
