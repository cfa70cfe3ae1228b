"""A translated run's device (`python -m cdeit_jax.translate`, docs/your_device.md): the
translation of its frames into its model's system, and the checks of what a run is given as its
frames, in one place (`TranslatedDevice`, the run's `run_frames.Frames` value), which the
Reconstructor's guards (`TranslatedGuards`) and eval.py's recording source (`TranslatedSource`)
both use:

- a reference frame is the device's empty tank as the run calibrated it (`check_reference`):
  one that is not its pattern (another protocol's, another device's), is its negation (a
  reversed current) or is at another scale (other units) is refused in one line naming the
  difference; a device file given as frames or reference is checked for the device's currents
  and measured pairs by `frame_guards.check_source`, as for every run;
- a frame's missing values (NaN) are left out and the rest translate (`eit.translation`); only
  a frame whose present values leave a value the model reads undetermined is refused, naming
  the values it misses (`undetermined`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from cdeit_jax.checkpoints import checkpoint
from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.eit import layout, translation
from cdeit_jax.eit.reference_match import SAME_TANK_COS, SCALE, likeness
from cdeit_jax.infer import run_frames
from cdeit_jax.infer.frame_guards import FrameGuards, Screen, listed

# A reference frame is the run's empty tank when its cosine with the calibrated one is at least
# SAME_TANK_COS and its scale (the coefficient along it) within SCALE (`eit.reference_match`:
# the same tank's frames of its targets keep 0.983 or more with it, the other protocol's empty
# tank 0.49, a reversed current's -1; other units are factors of 1000).
# A frame's present values determine a value of the model's system when they give at least this
# share of its prior variance (`Translator.determined_values`): every UEF2017 value with one value,
# a whole pattern or half the values missing (at least 0.94); 30 of 256 values left 0.69.
INFERRED = 0.5


@dataclasses.dataclass(frozen=True, eq=False)
class TranslatedDevice(run_frames.Frames):
  """The device of a translated run's `path` (its TRANSLATION_FILE: the calibrated device file)
  and its frames' translation into the model's system (`translator`); `empty` (R,): the empty
  tank's frame in the device's units as calibrated (NaN: a value it lacks), or None. As a run's
  `run_frames.Frames`: every value of the device read (its model has no removal sets), a
  missing one left out of the translation."""

  translator: translation.Translator
  empty: np.ndarray | None
  path: str
  may_miss = True  # a missing value is left out of the translation

  @classmethod
  def open(cls, path: str, target: layout.Layout) -> TranslatedDevice:
    """The device of the translation file at `path`, translated into `target` (the model's)."""
    device, empty = layout.from_device_file(path)
    return cls(translation.Translator.between(device, target), empty, path)

  @property
  def device(self) -> layout.Layout:
    return self.translator.device

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """The model's values (N, R_model) of device values (N, R) in simulation units (NaN: left
    out), as `eit.translation.Translator` makes them."""
    return self.translator(values)

  def guards(self, own: FrameGuards, units: layout.Layout) -> TranslatedGuards:
    return TranslatedGuards(own, self, units)

  def removed(self, removed: np.ndarray) -> np.ndarray:
    return np.zeros(self.device.num_values, bool)

  def ignored(self, ignored: np.ndarray) -> np.ndarray:
    return np.zeros(self.device.num_values, bool)

  def reads_values(self, vector: bool) -> bool:
    return True  # the device's values, conditioned once translated (`TranslatedSource`)

  def source(self, recording, mean: np.ndarray, std: np.ndarray) -> TranslatedSource:
    return TranslatedSource(recording, self, mean, std)

  def check_kind(self, kind, workdir: str) -> None:
    """Only the device's own recordings are its frames: another kind is of the model's own
    system, which its model folder reads."""
    if not kind.device_frames:
      raise InputError(
        f"--workdir {workdir} reads its device's frames translated into its model's system "
        f"(translation.npz): score its device's recordings with --data recording; --data "
        f"{kind.name} is of the model's own system: --workdir "
        f"{fileio.join(workdir, checkpoint.MODEL_FOLDER)}"
      )

  def reading(self) -> str:
    return f" reading {self.device.describe()} translated into {self.translator.target.describe()}"

  def check_reference(self, reference: np.ndarray, where: str) -> None:
    """An InputError naming `where` when `reference` (R,), in the device's units, is not the
    run's empty tank: not its pattern, negated, or at another scale (module docstring)."""
    if self.empty is None:
      return
    s = likeness(reference, self.empty)
    cos, scale, apart = float(s.cos[0]), float(s.scale[0]), float(s.apart[0])
    if not np.isfinite(cos):
      return  # nothing to compare (all zero, or missing): the frames' own guards judge them
    run = f"this run's empty tank ({self.path}, {self.device.describe()})"
    if cos <= -SAME_TANK_COS:
      raise InputError(
        f"{where}: is {run} negated (cosine {cos:.2f}): the current, or the measured pairs, "
        "reversed; give frames and reference measured as the device was when it was calibrated "
        "(or both negated back)"
      )
    if cos < SAME_TANK_COS:
      raise InputError(
        f"{where}: differs from {run} by {apart:.0%} (cosine {cos:.2f}; the same tank's frames "
        f"stay above {SAME_TANK_COS}): it is another protocol's or another device's empty tank; "
        "give the frames and reference of the device the run was made for, or make a run for "
        "this one (make device-model DEVICE=its ref.mat RUN=NEW)"
      )
    if not SCALE[0] <= scale <= SCALE[1]:
      raise InputError(
        f"{where}: is {scale:.3g} times {run}: other units, or another current; give frames and "
        "reference in the units the device was calibrated in"
      )

  @functools.lru_cache(maxsize=16)  # noqa: B019 (one device per run; a few missing sets)
  def _determined(self, present: bytes) -> np.ndarray:
    return self.translator.determined_values(np.frombuffer(present, bool))

  def undetermined(self, values: np.ndarray) -> tuple[np.ndarray, str]:
    """(rows (N,) bool, why in words) of device values (N, R) whose present (finite) values
    leave a value of the model's system undetermined (under INFERRED of its prior variance):
    a frame missing every value, or too many, names the values it misses."""
    present = np.isfinite(values)
    rows, notes = np.zeros(len(values), bool), []
    for mask in np.unique(present, axis=0):
      if mask.all():
        continue
      share = self._determined(np.ascontiguousarray(mask).tobytes()) if mask.any() else None
      if share is not None and share.min() >= INFERRED:
        continue
      here = np.all(present == mask, axis=1)
      rows |= here
      missing = np.flatnonzero(~mask)
      named = ", ".join(self._named(i) for i in missing[:3])
      more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
      low = "every value" if share is None else f"value {int(np.argmin(share))}"
      notes.append(
        f"rows {listed(np.flatnonzero(here))} miss {len(missing)} of the device's "
        f"{len(mask)} values ({named}{more}), without which the translation cannot infer "
        f"{low} of the model's (under {INFERRED:.0%} of its variance): give those values"
      )
    return rows, "; ".join(notes)

  def _named(self, i: int) -> str:
    p, plus, minus = (int(x) for x in self.device.rows[i])
    return f"value {i}: pattern {p}, electrodes {plus}-{minus}"


class TranslatedSource(sources.ArraySource):
  """A device's recording (`recording.RecordingSource`'s frames) for a translated run: each
  example's condition made of its values translated into the model's system
  (`eit.translation`); `ys` stays the device's own values in simulation units (Tikhonov's, of
  the device)."""

  baselines = False

  def __init__(self, recording, translator: TranslatedDevice, mean, std):
    own = recording.dv / np.float32(recording.voltage_ratio)
    super().__init__(
      translator(own), recording._xs, mean, std, name=recording.path, vector_cond=False
    )
    self.own = own
    self.dv, self.absent, self.files = recording.dv, recording.absent, recording.files
    self.units, self.voltage_ratio = "simulated", 1.0

  def __getitem__(self, i: int) -> dict[str, Any]:
    return {**super().__getitem__(i), "ys": self.own[i]}


class TranslatedGuards(FrameGuards):
  """The guards of a device's frames that a model of another system reads translated
  (a Reconstructor of `TranslatedDevice` frames): the device's shapes, reference frame (its empty
  tank, `TranslatedDevice.check_reference`), missing values (left out where the rest determine
  the translation) and infinite ones; the absolute frames', units' and size guards on the
  translated values, as the model's own guards (`inner`) judge its frames."""

  def __init__(self, inner: FrameGuards, translated: TranslatedDevice, units: layout.Layout):
    self.inner, self.translator = inner, translated
    self.layout, self.vector = translated.device, False
    self.num_values = self.layout.num_values
    self.removed = np.zeros((1, self.num_values), bool)
    self.ignored = np.zeros(self.num_values, bool)
    self.mean, self.std, self.drift = inner.mean, inner.std, inner.drift
    self.units, self.voltage_ratio = units, units.gain

  @property
  def takes_missing(self) -> bool:
    return True  # a missing value is left out of the translation

  def check_reference(self, reference: np.ndarray, where: str) -> None:
    self.translator.check_reference(reference, where)

  def _screen(self, v: np.ndarray, first_row: int) -> Screen:
    infinite = np.isinf(v).any(1)
    undetermined, note = self.translator.undetermined(np.where(infinite[:, None], 0.0, v))
    bad = infinite | undetermined
    t = self.translator(np.where(bad[:, None], 0.0, v))
    t[bad] = np.nan  # refused by the model's guards as a frame missing values
    return dataclasses.replace(self.inner._screen(t, first_row), note=note)
