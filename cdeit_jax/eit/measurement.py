"""The measurement: what a CDEIT condition is made of, in one place.

- The measuring system is one value, `eit.layout.Layout` (electrodes, patterns, units, contact
  impedance); CDEIT's is the preset "cdeit16" (16 electrodes, adjacent-adjacent, 208 values).
- Units, a view of the device: a data set's voltages are in its measuring system's units; the
  voltage ratio (measured / simulated, the `Layout`'s `gain`) brings them to the simulator's (a
  preset of `layout.PRESETS` holds its device's); `in_units` resolves them once, as a `Layout`.
- Standardisation with the training set's statistics (`mean`, `std`, shaped (1, 16, 13) as the
  authors'), and the electrode interaction matrix (EIM, (16, 16)) built from the standardised
  voltages (`condition`), and read back (`voltages_from_eim`): a function of any device whose
  patterns are its electrodes and each measure as many values (`eim_tables`).
- `RunningStats`: the one streaming mean/std routine (float64, Chan et al.'s merge of batches).

Every function takes numpy or jax arrays (indexing and arithmetic only), so the file source on the
host and the simulator source on the devices compute the same thing with the same code. This
module imports neither jax nor the physics (configs read it).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit.layout import CONTACT_IMPEDANCE, CURRENT, Layout  # noqa: F401 (re-exported)

IMAGE_SIZE = 128  # the label images' grid (CDEIT's data format)

SIMULATED = "simulated"  # the units of the simulator's own data, whatever the system


def unit_names() -> list[str]:
  """The names `units` knows: "simulated" and the measuring systems' presets
  (`layout.PRESETS`: each holds its device's units)."""
  return [SIMULATED, *layout_lib.PRESETS]


def preset_ratios(name: str) -> tuple[float, float] | None:
  """(voltage_ratio, current_ratio) of a named system's data (`unit_names`), else None."""
  if name == SIMULATED:
    return 1.0, 1.0
  if name in layout_lib.PRESETS:
    lay = layout_lib.preset(name)
    return float(lay.gain), float(lay.current_ratio)
  return None


def cdeit16() -> Layout:
  """CDEIT's measuring system: 16 electrodes, adjacent injections and measurements."""
  return layout_lib.preset("cdeit16")


@functools.lru_cache(maxsize=8)
def eim_tables(lay: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(rows, index, mask) gathering a device's values (..., patterns, per pattern) into its
  electrode interaction matrix (..., E, E): row p, column m holds pattern p's value whose
  first electrode is m, zero where none is. The EIM of a device whose patterns are its
  electrodes, each measuring as many values with distinct first electrodes (CDEIT's 16 x 13);
  an InputError for another."""
  table, e = lay.pattern_table, lay.num_electrodes
  plus = lay.rows[:, 1]
  if table is None or lay.num_patterns != e or any(len(set(plus[t])) != len(t) for t in table):
    raise InputError(
      f"{lay.describe()}: an electrode interaction matrix needs one pattern per electrode, "
      "each measuring as many values on distinct pairs; condition on its values instead "
      "(config.model.cond='linear')"
    )
  index = np.zeros((e, e), np.int32)
  mask = np.zeros((e, e), np.float32)
  rows = np.arange(e)[:, None]
  index[rows, plus[table]] = np.arange(table.shape[1])[None]
  mask[rows, plus[table]] = 1.0
  for a in (rows, index, mask):
    a.setflags(write=False)
  return rows, index, mask


def eim(voltages, lay: Layout):
  """Electrode interaction matrix (..., E, E) of standardised voltages (..., patterns, per
  pattern) (`eim_tables`)."""
  rows, index, mask = eim_tables(lay)
  return voltages[..., rows, index] * mask.astype(voltages.dtype)


def from_eim(matrix, lay: Layout):
  """The voltages (..., patterns, per pattern) of an EIM (..., E, E): `eim`'s inverse."""
  eim_tables(lay)  # the refusal of a device without one
  return matrix[..., np.arange(lay.num_patterns)[:, None], lay.rows[lay.pattern_table, 1]]


def stats_shape(lay: Layout) -> tuple[int, ...]:
  """The statistics' layout: (1, patterns, values per pattern), the authors' (1, 16, 13), for a
  device with an EIM (`eim_tables`), else (1, values)."""
  try:
    eim_tables(lay)
  except InputError:
    return (1, lay.num_values)
  return (1, *lay.pattern_table.shape)


NUM_ELECTRODES = 16  # CDEIT's system (`cdeit16`)
NUM_MEASUREMENTS = 208
STATS_SHAPE = (1, 16, 13)


def resolve_ratios(
  units: str, voltage_ratio: float | None = None, current_ratio: float | None = None
) -> tuple[float, float]:
  """(voltage_ratio, current_ratio) of the units `units` (`unit_names`), each overridden where
  given; another name needs both."""
  known = preset_ratios(units) if isinstance(units, str) else None
  if known is None and (voltage_ratio is None or current_ratio is None):
    raise InputError(
      f"unknown units {units!r}: use one of {unit_names()}, or give both "
      "voltage_ratio and current_ratio"
    )
  v, c = known or (None, None)
  return checked_ratios(
    voltage_ratio if voltage_ratio is not None else v,
    current_ratio if current_ratio is not None else c,
  )


def checked_ratios(voltage_ratio, current_ratio) -> tuple[float, float]:
  """The two ratios as floats; an InputError naming one that is not a positive number."""
  ratios = {"voltage_ratio": voltage_ratio, "current_ratio": current_ratio}
  for name, r in ratios.items():
    if isinstance(r, bool) or not (isinstance(r, (int, float)) and 0 < r < float("inf")):
      raise InputError(
        f"{name}={r!r}: must be a positive number (measured / simulated units; a "
        "negative one would turn the images' sign)"
      )
  return float(voltage_ratio), float(current_ratio)


def in_units(
  device: Layout,
  units: str | Layout,
  voltage_ratio: float | None = None,
  current_ratio: float | None = None,
) -> Layout:
  """The device `device` as data in `units` are: a units name (`unit_names`; another name with
  both ratios) or a device already in its units (a `Layout`, e.g. a calibrated device's own),
  each ratio overridden where given. The units are a view of the device (`Layout.in_units`): its
  `name` the units', `gain` the voltage ratio and `current_ratio` the current's."""
  return device.in_units(*named_ratios(units, voltage_ratio, current_ratio))


def own_units(device: Layout) -> Layout:
  """A model's device in the units its data are in when none are given: the device's own (a
  preset's, e.g. ktc2023's, or a calibrated device's fitted gain), else the simulator's."""
  if device.contact_impedance is None and device.gain == 1.0 and device.current_ratio == 1.0:
    return in_units(device, SIMULATED)
  name = device.name + (", calibrated" if device.contact_impedance is not None else "")
  return device.in_units(name, float(device.gain), float(device.current_ratio))


def named_ratios(
  units: str | Layout, voltage_ratio: float | None = None, current_ratio: float | None = None
) -> tuple[str, float, float]:
  """(name, voltage_ratio, current_ratio) of `units` (a name, or a device in its units), each
  ratio overridden where given: what `in_units` and a source of files need of them."""
  if isinstance(units, Layout):
    return units.name, *checked_ratios(
      units.gain if voltage_ratio is None else voltage_ratio,
      units.current_ratio if current_ratio is None else current_ratio,
    )
  v, c = resolve_ratios(units, voltage_ratio, current_ratio)
  if (voltage_ratio, current_ratio) != (None, None) and (v, c) != preset_ratios(units):
    units = f"{units} (voltage ratio {v:g}, current ratio {c:g})"  # the ratios given win
  return units, v, c


def standardise(ys, voltage_ratio: float, mean, std, lay: Layout):
  """(standardised voltages (..., patterns, per pattern), scaled voltages (same)) of measured
  `ys` (..., values[, 1]) of the device `lay`: scaled = ys / voltage_ratio
  (simulation units), then (scaled - mean) / std. Keeps the input's float type (float32
  throughout, numpy or jax)."""
  shape = stats_shape(lay)[1:]
  m = int(np.prod(shape))
  ys = (
    ys.reshape(*ys.shape[:-2], *shape)
    if ys.shape[-1] == 1 and ys.ndim >= 2 and ys.shape[-2] == m
    else ys.reshape(*ys.shape[:-1], *shape)
  )
  scaled = ys / ys.dtype.type(voltage_ratio) if isinstance(ys, np.ndarray) else ys / voltage_ratio
  return (scaled - mean.reshape(shape)) / std.reshape(shape), scaled


def condition(ys, voltage_ratio: float, mean, std, lay: Layout):
  """(EIM condition (..., E, E, 1), standardised voltages, scaled voltages (..., values)) of
  measured `ys`: what the network sees, and what the baselines and the statistics take."""
  v, scaled = standardise(ys, voltage_ratio, mean, std, lay)
  return eim(v, lay)[..., None], v, scaled.reshape(*scaled.shape[:-2], -1)


def voltages_from_eim(cond, mean, std, lay: Layout):
  """(..., values) voltages in simulation units (ys / voltage_ratio) read back from an EIM
  condition (..., E, E, 1) standardised with (mean, std): `condition`'s inverse."""
  v = from_eim(cond[..., 0], lay)
  v = v.reshape(*v.shape[:-2], -1)
  return v * std.reshape(-1) + mean.reshape(-1)


class RunningStats:
  """Per-measurement mean and std (N-1) of a stream of voltage batches, in float64 (Chan et al.'s
  parallel update, which is Welford's for batches of one): one pass, numerically stable, any
  batch sizes, the same result however the stream is cut."""

  def __init__(self, num_values: int = NUM_MEASUREMENTS):
    """`num_values`: the measuring system's count (results shaped (1, 16, 13) for CDEIT's 208,
    else (1, R))."""
    self.size = int(num_values)
    self.shape = STATS_SHAPE if self.size == NUM_MEASUREMENTS else (1, self.size)
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
    """float32 (mean, std), each shaped (1, 16, 13) for CDEIT's 208 values, else (1, R)."""
    if self.count < 2:
      raise InputError(f"{source}: {self.count} example(s); a std (N-1) needs at least 2")
    shape = self.shape
    std = np.sqrt(self._m2 / (self.count - 1))
    return self._mean.reshape(shape).astype(np.float32), std.reshape(shape).astype(np.float32)
