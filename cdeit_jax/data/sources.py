"""CDEIT examples: a folder of npz files (`cdeit_jax.data.npz_files`), or arrays in memory, as a
random-access source of conditioned examples (`measurement.condition`: scaled and standardised
voltages, their EIM) and targets.
"""

from __future__ import annotations

import zipfile
from typing import Any

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import npz_files
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.data.npz_files import BASELINE_KEYS, DatasetError
from cdeit_jax.eit import measurement
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import IMAGE_SIZE

# ----------------------------------------------------------------------------- the sources


def condition(ys, voltage_ratio: float, mean, std, vector: bool = False):
  """`measurement.condition` (the EIM of CDEIT's 208 values), or with `vector` (the condition
  of `cond="linear"`, any measuring system) the standardised values (..., R) as they are:
  (cond, standardised, scaled); NaN (a missing value) stays NaN. `ys` (R,) or (R, 1) is one
  example."""
  ys = np.asarray(ys, np.float32)
  if vector and ys.ndim == 2 and ys.shape[-1] == 1:
    ys = ys[:, 0]  # one example's (R, 1) as stored in the npz files
  if not vector:  # the EIM: of CDEIT's 16 x 13 values, the one system it is made for
    return measurement.condition(ys, voltage_ratio, mean, std, measurement.cdeit16())
  scaled = ys.reshape(*ys.shape[:-1], -1) / np.float32(voltage_ratio)
  v = (scaled - np.ravel(mean)) / np.ravel(std)
  return v, v, scaled


class NpzSource:
  """Random-access source (grain protocol: `len`, `[i]`) over a folder of CDEIT npz files.

  Returns float32 `cond` (16, 16, 1) the EIM of the scaled, standardised voltages, `voltages`
  (16, 13) those standardised voltages, `ys` (208,) the scaled ones (ys / voltage_ratio, what
  the simulator and the linear reconstructions take), `target` (128, 128, 1), `index` and `name`;
  with `baselines=True` also the stored classical reconstructions (`TR`, `xs_gn`, NaN where a
  file lacks them). With `cache` every file is read once, when the source opens. `units`: the
  files' units, a name (`measurement.unit_names`; another with both ratios) or a device in its
  units (`measurement.in_units`).
  """

  def __init__(
    self,
    path: str,
    units: str | Layout = "simulated",
    stats: Any = None,
    *,
    voltage_ratio: float | None = None,
    current_ratio: float | None = None,
    checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
    skip_bad: bool = False,
    validate_files: bool = True,
    cache: bool = False,
    baselines: bool = False,
    num_values: int = measurement.NUM_MEASUREMENTS,
    vector_cond: bool = False,
    removed: np.ndarray | None = None,
    stats_flag: str = "--config.eval.stats",
  ):
    self.path = fileio.resolve(path)
    self.num_values, self.vector_cond = num_values, vector_cond
    # (R,) bool: values every condition loses (NaN), as a device without some electrodes
    self.removed = None if removed is None or not np.any(removed) else np.asarray(removed, bool)
    if self.removed is not None and not vector_cond:
      raise InputError("removing values needs the vector condition (cond 'linear')")
    self.units, self.voltage_ratio, self.current_ratio = measurement.named_ratios(
      units, voltage_ratio, current_ratio
    )
    names = npz_files.list_files(self.path)
    npz_files.check_count(self.path, names[0], num_values)
    arrays = None
    if validate_files and cache:  # validation reads each file; keep what it read
      self.files, arrays = npz_files.check_folder(
        self.path, names, skip_bad=skip_bad, keep=True, num_values=num_values
      )
    elif validate_files:
      self.files = npz_files.check_folder(
        self.path, names, skip_bad=skip_bad, num_values=num_values
      )
    else:
      self.files = names
    self.statistics = stats_lib.resolve_stats(self.path, stats, checkpoint_stats, flag=stats_flag)
    self.mean, self.std = self.statistics.mean, self.statistics.std
    stats_lib.check_count(self.mean, num_values, self.path)
    self.baselines = baselines
    self._cache: list[dict] | None = None
    if cache:
      self._cache = [
        self._load(i, None if arrays is None else arrays[name]) for i, name in enumerate(self.files)
      ]

  def __len__(self) -> int:
    return len(self.files)

  def __repr__(self) -> str:
    return f"NpzSource({self.path!r}, units={self.units!r}, n={len(self)})"

  def condition(self, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cond (16,16,1), standardised voltages (16,13), scaled voltages (208,)) from raw `ys`
    (208,) in measured units; with `vector_cond` (any measuring system, R values): (standardised
    (R,), standardised (R,), scaled (R,))."""
    return condition(ys, self.voltage_ratio, self.mean, self.std, self.vector_cond)

  def _load(self, i: int, z: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    path = fileio.join(self.path, self.files[i])
    try:
      if z is None:
        z = npz_files.read_npz(path, ("ys", "xs") + (BASELINE_KEYS if self.baselines else ()))
      cond, v, scaled = self.condition(z["ys"])
      if self.removed is not None:
        cond = np.where(self.removed, np.float32(np.nan), cond)
      ex = {
        "cond": cond,
        "voltages": v,
        "ys": scaled,
        "target": np.asarray(z["xs"], np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 1),
        "index": np.int32(i),
        "name": self.files[i],
      }
      if self.baselines:
        for k in BASELINE_KEYS:
          ex[k] = (
            np.asarray(z[k], np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 1)
            if k in z
            else np.full((IMAGE_SIZE, IMAGE_SIZE, 1), np.nan, np.float32)
          )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
      raise DatasetError(f"{path}: {e}") from e
    return ex

  def __getitem__(self, i: int) -> dict[str, Any]:
    if self._cache is not None:
      return self._cache[i]
    return self._load(i)


class ArraySource:
  """In-memory examples with `NpzSource`'s items: voltages `ys` (n, R) in simulation units (the
  "simulated" preset) and label images `xs` (n, 128, 128), standardised with (mean, std). The
  simulator source's fixed sets (statistics, validation) are ArraySources."""

  units, voltage_ratio = "simulated", 1.0

  def __init__(
    self,
    ys: np.ndarray,
    xs: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    *,
    name: str,
    vector_cond: bool = False,
  ):
    self.path = name  # what messages call it
    self._ys, self._xs = np.asarray(ys, np.float32), np.asarray(xs, np.float32)
    self.mean, self.std = stats_lib.check_stats(mean, std, source=name)
    self.vector_cond = vector_cond

  def __len__(self) -> int:
    return len(self._ys)

  def __repr__(self) -> str:
    return f"ArraySource({self.path!r}, n={len(self)})"

  def __getitem__(self, i: int) -> dict[str, Any]:
    cond, v, scaled = condition(
      self._ys[i], self.voltage_ratio, self.mean, self.std, self.vector_cond
    )
    return {
      "cond": cond,
      "voltages": v,
      "ys": scaled,
      "target": self._xs[i].reshape(IMAGE_SIZE, IMAGE_SIZE, 1),
      "index": np.int32(i),
      "name": f"{i:07d}",
    }
