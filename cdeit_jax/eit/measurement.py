"""The measurement: what a CDEIT condition is made of, in one place.

- `Protocol`: electrodes, the current injection and voltage measurement patterns (which
  measurements exist and in which order); 16 electrodes, adjacent-adjacent, is the CDEIT default.
- `Units`: a data set's voltages are in its measuring system's units; `voltage_ratio` (measured /
  simulated) brings them to the simulator's (a preset of `layout.PRESETS` holds its device's);
  `units` resolves them once.
- Standardisation with the training set's statistics (`mean`, `std`, shaped (1, 16, 13) as the
  authors'), and the electrode interaction matrix (EIM, (16, 16)) built from the standardised
  voltages (`condition`), and read back (`voltages_from_eim`).
- `RunningStats`: the one streaming mean/std routine (float64, Chan et al.'s merge of batches).

Every function takes numpy or jax arrays (indexing and arithmetic only), so the file source on the
host and the simulator source on the devices compute the same thing with the same code. This
module imports neither jax nor the physics (configs read it).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from cdeit_jax.common.errors import InputError

IMAGE_SIZE = 128  # the label images' grid (CDEIT's data format)
CONTACT_IMPEDANCE = 0.01  # the simulated system's contact impedance (reference conventions)
CURRENT = 1e-3  # injected current (A) of the simulated system

SIMULATED = "simulated"  # the units of the simulator's own data, whatever the system


def unit_names() -> list[str]:
  """The names `units` knows: "simulated" and the measuring systems' presets
  (`layout.PRESETS`: each holds its device's units)."""
  from cdeit_jax.eit import layout

  return [SIMULATED, *layout.PRESETS]


def preset_ratios(name: str) -> tuple[float, float] | None:
  """(voltage_ratio, current_ratio) of a named system's data (`unit_names`), else None."""
  from cdeit_jax.eit import layout

  if name == SIMULATED:
    return 1.0, 1.0
  if name in layout.PRESETS:
    lay = layout.preset(name)
    return float(lay.gain), float(lay.current_ratio)
  return None


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Electrode count and patterns. Injection k drives current from electrode k to
  k+1+injection_skip; the voltages measured are U_m - U_{m+1+measurement_skip} for every m whose
  pair touches no
  injecting electrode (EIDORS's convention; skip 0 is "adjacent"). Measurements are ordered by
  injection, then m: the CDEIT `ys` order."""

  num_electrodes: int = 16
  injection_skip: int = 0
  measurement_skip: int = 0

  def __post_init__(self):
    n = self.num_electrodes
    if not (isinstance(n, int) and n >= 4):
      raise InputError(f"protocol: num_electrodes={n!r} must be an integer >= 4")
    for name in ("injection_skip", "measurement_skip"):
      skip = getattr(self, name)
      if not (isinstance(skip, int) and 0 <= skip <= n - 2):
        raise InputError(f"protocol: {name}={skip!r} must be an integer in [0, {n - 2}]")
    counts = {len(row) for row in self._pairs()}
    if len(counts) != 1 or counts == {0}:
      raise InputError(f"protocol {self}: injections measure unequal or no voltages")

  def _pairs(self) -> list[list[int]]:
    n, si, sm = self.num_electrodes, self.injection_skip + 1, self.measurement_skip + 1
    return [[m for m in range(n) if not {m, (m + sm) % n} & {k, (k + si) % n}] for k in range(n)]

  @functools.cached_property
  def pairs(self) -> np.ndarray:
    """(electrodes, measurements per injection): the first electrode m of each measured pair."""
    out = np.asarray(self._pairs(), np.int32)
    out.setflags(write=False)
    return out

  @property
  def per_injection(self) -> int:
    return self.pairs.shape[1]

  @property
  def num_measurements(self) -> int:
    return self.num_electrodes * self.per_injection

  @property
  def stats_shape(self) -> tuple[int, int, int]:
    """The authors' mean/std layout (1, injections, measurements per injection)."""
    return (1, self.num_electrodes, self.per_injection)

  def currents(self, current: float = CURRENT) -> np.ndarray:
    """(injections, electrodes) currents: -I on electrode k, +I on k+1+skip ("+" = into the
    body)."""
    n = self.num_electrodes
    out = np.zeros((n, n))
    k = np.arange(n)
    out[k, k] = -current
    out[k, (k + self.injection_skip + 1) % n] = current
    return out

  def second_electrodes(self) -> np.ndarray:
    """(electrodes, measurements per injection): the second electrode of each measured pair."""
    return (self.pairs + self.measurement_skip + 1) % self.num_electrodes

  @functools.cached_property
  def _eim_gather(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = self.num_electrodes
    index = np.zeros((n, n), np.int32)
    mask = np.zeros((n, n), np.float32)
    rows = np.arange(n)[:, None]
    index[rows, self.pairs] = np.arange(self.per_injection)[None]
    mask[rows, self.pairs] = 1.0
    return rows, index, mask

  def eim(self, voltages):
    """Electrode interaction matrix (..., n, n) of standardised voltages (..., n, per injection):
    row k, column m holds measurement U_m - U_m' of injection k, zero where nothing is measured."""
    rows, index, mask = self._eim_gather
    return voltages[..., rows, index] * mask.astype(voltages.dtype)

  def from_eim(self, eim):
    """The voltages (..., n, per injection) of an EIM (..., n, n): `eim`'s inverse."""
    return eim[..., np.arange(self.num_electrodes)[:, None], self.pairs]


DEFAULT = Protocol()


@dataclasses.dataclass(frozen=True)
class System:
  """A measuring system as the physics computes with it, one value handed to the simulator, the
  Jacobian and the Tikhonov baseline, the physics-informed conditioning and data consistency: its
  electrodes and patterns (`protocol`), the electrodes' contact impedance and the injected
  current (A). The per-example draws around it are `eit.spec.SystemSpec`. Hashable: per-system
  caches key on it."""

  protocol: Protocol = DEFAULT
  contact_impedance: float = CONTACT_IMPEDANCE
  current: float = CURRENT

  def __post_init__(self):
    for name in ("contact_impedance", "current"):
      v = getattr(self, name)
      if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
        raise InputError(f"measuring system: {name}={v!r} must be a positive number")


NOMINAL = System()


def system_of(simulator: Any) -> System:
  """The nominal measuring system of `config.simulator` (its contact impedance; the CDEIT
  protocol and current)."""
  return System(contact_impedance=float(simulator.contact_impedance))


NUM_ELECTRODES = DEFAULT.num_electrodes
NUM_MEASUREMENTS = DEFAULT.num_measurements  # 208
STATS_SHAPE = DEFAULT.stats_shape  # (1, 16, 13)


def resolve_ratios(
  preset: str, voltage_ratio: float | None = None, current_ratio: float | None = None
) -> tuple[float, float]:
  """(voltage_ratio, current_ratio) of a preset, each overridden where given."""
  known = preset_ratios(preset) if isinstance(preset, str) else None
  if known is None and (voltage_ratio is None or current_ratio is None):
    raise InputError(
      f"unknown data preset {preset!r}: use one of {unit_names()}, or give both "
      "voltage_ratio and current_ratio"
    )
  v, c = known or (None, None)
  ratios = {
    "voltage_ratio": voltage_ratio if voltage_ratio is not None else v,
    "current_ratio": current_ratio if current_ratio is not None else c,
  }
  for name, r in ratios.items():
    if isinstance(r, bool) or not (isinstance(r, (int, float)) and 0 < r < float("inf")):
      raise InputError(
        f"{name}={r!r}: must be a positive number (measured / simulated units; a "
        "negative one would turn the images' sign)"
      )
  return float(ratios["voltage_ratio"]), float(ratios["current_ratio"])


@dataclasses.dataclass(frozen=True)
class Units:
  """A data set's units against the simulator's: the preset's name (or the user's own name with
  both ratios), its voltage ratio and current ratio (measured / simulated)."""

  name: str
  voltage_ratio: float
  current_ratio: float

  @property
  def conductivity_factor(self) -> float:
    """Label units -> the device's conductivity units (current ratio / voltage ratio)."""
    return self.current_ratio / self.voltage_ratio


def units(
  preset: str | Units = "simulated",
  voltage_ratio: float | None = None,
  current_ratio: float | None = None,
) -> Units:
  """The `Units` of a name (`unit_names`), each ratio overridden where given; a `Units` as it
  is."""
  if isinstance(preset, Units):
    if voltage_ratio is not None or current_ratio is not None:
      raise InputError(f"units {preset.name!r} are resolved already: give ratios or Units")
    return preset
  return Units(preset, *resolve_ratios(preset, voltage_ratio, current_ratio))


def standardise(ys, voltage_ratio: float, mean, std, protocol: Protocol = DEFAULT):
  """(standardised voltages (..., n, per injection), scaled voltages (..., n, per injection)) of
  measured `ys` (..., measurements[, 1]): scaled = ys / voltage_ratio (simulation units), then
  (scaled - mean) / std. Keeps the input's float type (float32 throughout, numpy or jax)."""
  shape = protocol.stats_shape[1:]
  ys = (
    ys.reshape(*ys.shape[:-2], *shape)
    if ys.shape[-1] == 1 and ys.ndim >= 2 and ys.shape[-2] == protocol.num_measurements
    else ys.reshape(*ys.shape[:-1], *shape)
  )
  scaled = ys / ys.dtype.type(voltage_ratio) if isinstance(ys, np.ndarray) else ys / voltage_ratio
  return (scaled - mean.reshape(shape)) / std.reshape(shape), scaled


def condition(ys, voltage_ratio: float, mean, std, protocol: Protocol = DEFAULT):
  """(EIM condition (..., n, n, 1), standardised voltages, scaled voltages (..., measurements))
  of measured `ys`: what the network sees, and what the baselines and the statistics take."""
  v, scaled = standardise(ys, voltage_ratio, mean, std, protocol)
  return protocol.eim(v)[..., None], v, scaled.reshape(*scaled.shape[:-2], -1)


def voltages_from_eim(cond, mean, std, protocol: Protocol = DEFAULT):
  """(..., measurements) voltages in simulation units (ys / voltage_ratio) read back from an EIM
  condition (..., n, n, 1) standardised with (mean, std): `condition`'s inverse."""
  v = protocol.from_eim(cond[..., 0])
  v = v.reshape(*v.shape[:-2], protocol.num_measurements)
  return v * std.reshape(-1) + mean.reshape(-1)


class RunningStats:
  """Per-measurement mean and std (N-1) of a stream of voltage batches, in float64 (Chan et al.'s
  parallel update, which is Welford's for batches of one): one pass, numerically stable, any
  batch sizes, the same result however the stream is cut."""

  def __init__(self, protocol: Protocol = DEFAULT, num_values: int | None = None):
    """`num_values`: another measuring system's count (results shaped (1, R))."""
    self.protocol = protocol
    self.size = protocol.num_measurements if num_values is None else int(num_values)
    self.shape = protocol.stats_shape if self.size == protocol.num_measurements else (1, self.size)
    self.count = 0
    self._mean = np.zeros(self.size)
    self._m2 = np.zeros(self.size)

  def add(self, ys: Any, voltage_ratio: float = 1.0) -> None:
    """Add a batch (b, measurements) or one example (measurements[, 1]), divided by the ratio."""
    x = np.asarray(ys, np.float64).reshape(-1, self.size) / voltage_ratio
    n = len(x)
    if not n:
      return
    if self.count == 0:  # the first batch: two passes over it
      self._mean = x.mean(0)
      self._m2 = ((x - self._mean) ** 2).sum(0)
    elif n == 1:  # Welford's update
      delta = x[0] - self._mean
      self._mean = self._mean + delta / (self.count + 1)
      self._m2 = self._m2 + delta * (x[0] - self._mean)
    else:  # Chan et al.'s merge of two partial results
      mean = x.mean(0)
      total = self.count + n
      delta = mean - self._mean
      self._mean = self._mean + delta * n / total
      self._m2 = self._m2 + ((x - mean) ** 2).sum(0) + delta * delta * self.count * n / total
    self.count += n

  def result(self, source: str = "the data") -> tuple[np.ndarray, np.ndarray]:
    """float32 (mean, std), each shaped `protocol.stats_shape` (or (1, R))."""
    if self.count < 2:
      raise InputError(f"{source}: {self.count} example(s); a std (N-1) needs at least 2")
    shape = self.shape
    std = np.sqrt(self._m2 / (self.count - 1))
    return self._mean.reshape(shape).astype(np.float32), std.reshape(shape).astype(np.float32)
