"""The one set of guards of incoming frames (`FrameGuards`), which every entry point passes
(the Reconstructor's API, the reconstruct command, eval.py's recordings): frames as rows of the
model's measuring system's values, a reference frame subtracted in float64, and rows refused
in one line naming them: NaN where no electrode-removal set of the model leaves a value out,
infinite or out-of-range values, absolute frames given without their reference frame
(`absolute_rows`), and frames in other units than those given (far off the training data's
scale, or far too small for any device's).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import ml_collections
import numpy as np

from cdeit_jax import eit
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout, reference_match
from cdeit_jax.eit.reference_match import listed

FAR_OFF = 100.0  # a frame whose median |standardised voltage| exceeds this is in other units
# frames whose size (RMS) is typically under this fraction of the training data's spread (its
# std's RMS) are in other units: real differences are 0.1-1 of it, a device's noise alone about
# 0.003 or more, and simulation units given as a device's (divided by its gain twice) 0.0003-0.0009
FAR_SMALL = 1e-3
# Absolute frames (or a constant offset) instead of differences, told apart by their structure
# (`absolute_rows`); thresholds from real and simulated frames (docs/reconstructing.md): absolute
# ones reach 0.90-0.975 along the empty tank's pattern with a coefficient of 0.22-4.1 (gains
# 0.3-3), difference frames at most 0.70 along it and 0.72 along a constant, offsets 0.98-1.
ABSOLUTE_COS, ABSOLUTE_COEF, OFFSET_COS = 0.75, 0.2, 0.9
# A model trained with the background drifting between the empty tank's and the target's
# frames (`SystemSpec.drift`, up to D either way) reads difference frames that lie up to D x
# their gain (gain / background up to 1.1 / 0.9 in configs/ktc2023_model.py) further along the
# empty tank's pattern, so its coefficient's threshold grows by DRIFT_COEF x D (0.35 at
# D = 0.1: that config's validation simulations with drift=(0.9, 1.1) reach 0.22 at the higher
# levels; absolute frames at gains under about 0.4 then pass, at 0.5-3 they are still refused).
DRIFT_COEF = 1.5


@dataclasses.dataclass(frozen=True)
class Hints:
  """What a refusal asks for, in the words of the command that read the frames: `reference`
  for absolute frames (give the empty tank's frame), `same`: where a reference frame is given,
  for frames that are not of theirs (`eit.reference_match.check_frames`), `skip` for rows of
  NaN or infinite values.
  The defaults are reconstruct's and the Reconstructor's."""

  reference: str = (
    "give the empty-tank frame as the reference (--reference REF or --reference_row N; the "
    "API's `reference=`), so that each frame minus it is imaged"
  )
  same: str = "--reference REF or --reference_row N; the API's `reference=`"
  skip: str = (
    "remove them, or skip them (--skip_bad_frames: they are listed and their images are NaN)"
  )


RECONSTRUCT = Hints()


def absolute_rows(ys: np.ndarray, vh: np.ndarray, drift: float = 0.0) -> np.ndarray:
  """Which rows of `ys` (N, R), in simulation units (NaN: a missing value, left out of the
  row's sums), are absolute voltages or carry a constant offset rather than being differences:
  the empty tank's voltages `vh` (R,) dominate an absolute frame at any gain (a cosine of at
  least ABSOLUTE_COS, and a coefficient along `vh` of at least ABSOLUTE_COEF + DRIFT_COEF x
  `drift`, the model's largest drift (`drift_allowance`), which a small uniform change of a
  difference frame stays under), and a constant dominates an offset (a cosine of at least
  OFFSET_COS)."""
  x = np.asarray(ys, np.float64)
  present = np.isfinite(x)
  x = np.where(present, x, 0.0)
  h = np.where(present, np.asarray(vh, np.float64)[None], 0.0)  # vh at each row's values
  norm = np.linalg.norm(x, axis=1)
  norm = np.where(norm > 0, norm, np.inf)
  hh = np.maximum((h * h).sum(1), 1e-300)
  along = np.abs((x * h).sum(1))
  cos_vh = along / (norm * np.sqrt(hh))
  coef = along / hh
  cos_one = np.abs(x.sum(1)) / (norm * np.sqrt(np.maximum(present.sum(1), 1)))
  threshold = ABSOLUTE_COEF + DRIFT_COEF * float(drift)
  return ((cos_vh >= ABSOLUTE_COS) & (coef >= threshold)) | (cos_one >= OFFSET_COS)


def drift_allowance(config: ml_collections.ConfigDict) -> float:
  """The largest drift |d - 1| that the model's training drew (`SystemSpec.drift`;
  0 for a model trained without)."""
  from cdeit_jax.data import synthetic

  lo, hi = synthetic.system_spec(config.simulator).drift
  return max(1.0 - float(lo), float(hi) - 1.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Screen:
  """A block of rows through the row-wise guards (`FrameGuards.check_values`), rows numbered
  in the whole: refused as not finite (`bad`), imageable (`ok`), of those absolute or far off
  the training data's scale (with the largest typical |z|), and each imageable row's size."""

  bad: np.ndarray
  ok: np.ndarray
  absolute: np.ndarray
  far: np.ndarray
  far_typical: float
  sizes: np.ndarray
  note: str = ""  # why rows are refused, beyond their values (a translated run's missing ones)


class FrameGuards:
  """The guards of a model's frames: `model` says its measuring system (`layout`), whether it
  reads that system's values as a vector (`vector`) or CDEIT's EIM, `removed` (K, R): the
  values each of its electrode-removal sets leaves out, and `ignored` (R,): those it leaves out
  whatever they hold (config.model.current_carrying), which a frame may miss too. `mean`, `std`
  (1, 16, 13) or (1, R): the statistics its condition is standardised with; `units`: the
  device's units the frames come in (`measurement.in_units`: its `gain` the voltage ratio);
  `drift`: the model's largest drift (`drift_allowance`), which the absolute frames' guard
  allows for."""

  def __init__(self, model, mean: np.ndarray, std: np.ndarray, units: layout.Layout, drift: float):
    self.layout, self.vector = model.system.device, model.system.reads_values
    self.num_values = self.layout.num_values
    self.removed = (
      np.asarray(model.conditioner.removed[...])
      if self.vector
      else np.zeros((1, self.num_values), bool)
    )
    self.ignored = (
      np.asarray(model.conditioner.ignored[...]) if self.vector else np.zeros(self.num_values, bool)
    )
    self.mean, self.std, self.units, self.drift = mean, std, units, drift
    self.voltage_ratio = units.gain

  def rows(self, a: Any, where: str) -> np.ndarray:
    """`a` as float64 rows (N, R): one frame (R,) or (R, 1) is one row."""
    try:
      a = np.asarray(a)
    except (ValueError, TypeError) as e:
      raise InputError(f"{where}: not an array of voltages ({e})") from None
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
      raise InputError(f"{where}: voltages must be real numbers, got dtype {a.dtype}")
    m = self.num_values
    if a.shape in ((m,), (m, 1)):
      a = a.reshape(1, m)
    if a.ndim != 2 or a.shape[1] != m:
      raise layout.frames_shape_error(where, a.shape, m, self.layout.describe())
    return a.astype(np.float64)

  @property
  def takes_missing(self) -> bool:
    """Whether a reference frame may miss values (NaN): a model of a system's values (its
    removal sets say which frames may miss them), not CDEIT's EIM of every value."""
    return self.vector

  def difference(
    self,
    voltages: np.ndarray | None = None,
    *,
    frames: np.ndarray | None = None,
    reference: np.ndarray | None = None,
    where: str = "voltages",
    ref_where: str | None = None,
    first_row: int = 0,
    hints: Hints = RECONSTRUCT,
  ) -> np.ndarray:
    """(N, R) float32 difference voltages in the device's units: `voltages` as given, or
    `frames - reference` (time-difference imaging; `ref_where` names where the reference came
    from, by default `where`'s): the reference checked (`check_reference`) and the frames
    checked against it (`eit.reference_match.check_frames`: the same tank, protocol, sign and
    units; their rows numbered from `first_row`); `check_frames` checks the differences."""
    if (voltages is None) == (frames is None):
      raise InputError("give the difference voltages, or frames (and a reference frame)")
    if voltages is not None:
      if reference is not None:
        raise InputError("a reference frame goes with `frames`, not with difference voltages")
      return float32(self.rows(voltages, where))
    dv = self.rows(frames, where)
    if reference is not None:
      # in float64: frames and reference are large beside their difference
      ref_where = ref_where or f"{where}: the reference frame"
      ref = self.rows(reference, ref_where)
      if len(ref) != 1:
        raise InputError(
          f"{ref_where} must be one frame of {self.num_values} voltages, got {len(ref)} frames"
        )
      bad = np.isinf(ref[0]) | (np.isnan(ref[0]) & (not self.takes_missing))
      if bad.any():
        raise InputError(
          f"{ref_where} holds NaN or infinite voltages (at measurements "
          f"{listed(np.flatnonzero(bad))}); give a finite one"
        )
      self.check_reference(ref[0], ref_where)
      reference_match.check_frames(dv, ref[0], where, ref_where, hints.same, first_row)
      dv = dv - ref
    return float32(dv)

  def check_reference(self, reference: np.ndarray, where: str) -> None:
    """A reference frame (R,), in the device's units, that is the empty tank's pattern negated
    (the device measures with the other sign: every value of the model's empty tank is
    positive) is refused in one line (a translated run's is checked against its device's empty
    tank, `translated_run.TranslatedGuards`). A difference frame alone carries no sign: -dv is
    dv's objects with their contrasts reversed, so only a reference (or absolute frames) can
    tell."""
    cos = float(reference_match.likeness(reference, self.vh).cos[0])
    if cos <= -ABSOLUTE_COS:
      raise InputError(
        f"{where}: is the empty tank's voltages negated (cosine {cos:.2f} with the model's "
        "empty tank, whose values are all positive): the device measures with the opposite "
        "sign; negate the frames and the reference (reconstruct --negate; the API's "
        "`frames=-v, reference=-v_ref`)"
      )

  def check_recording(
    self,
    recording,
    reference: np.ndarray | None,
    where: str,
    skip_bad: bool = False,
    block: int = 4096,
    ref_where: str | None = None,
    hints: Hints = RECONSTRUCT,
  ) -> np.ndarray:
    """The rows of a recording (`infer.frames.Recording`, minus `reference`) that can be
    imaged: the guards of `check_values` over the whole recording, read `block` frames at a
    time (memory stays flat however long it is), judged once: every refused row of every block
    named in one line, the units' check on the whole recording's frames. Its frames need no
    check again when sampled (`Reconstructor.reconstruct(checked=True)`)."""
    check_source(recording, self.layout, where)
    screens = [
      self._screen(
        self.difference(
          frames=recording.rows(lo, lo + block),
          reference=reference,
          where=where,
          ref_where=ref_where,
          first_row=lo,
          hints=hints,
        )
        / self.voltage_ratio,
        lo,
      )
      for lo in range(0, recording.n, block)
    ]
    return self._judge(screens, where, skip_bad, self.units.name, hints)

  def check_frames(
    self,
    dv: np.ndarray,
    where: str = "voltages",
    skip_bad: bool = False,
    hints: Hints = RECONSTRUCT,
  ) -> np.ndarray:
    """The rows of `dv` (N, R), in the device's units, that can be imaged (indices):
    `check_values` of them in simulation units."""
    values = np.asarray(dv) / self.voltage_ratio
    return self.check_values(values, where, skip_bad, self.units.name, hints)

  def check_values(
    self,
    values: np.ndarray,
    where: str = "values",
    skip_bad: bool = False,
    units: str = "",
    hints: Hints = RECONSTRUCT,
  ) -> np.ndarray:
    """The rows of `values` (N, R), in simulation units, that can be imaged (indices): the one
    set of guards of every entry point. Rows with infinite values, or NaN where no value is
    missing under any of the model's electrode-removal sets (CDEIT's 208: none), are refused
    (listed in the error), or with `skip_bad` left out; absolute frames (no reference frame
    subtracted) and rows far off the statistics' scale (other units) are refused, and frames
    typically far too small for any device's (other units again). `hints`: what the refusals
    ask for, in the command's words."""
    v = np.asarray(values)
    if len(v) == 0:
      raise InputError(f"{where}: no frames (0 rows of {self.num_values} values)")
    return self._judge([self._screen(v, 0)], where, skip_bad, units, hints)

  def _screen(self, v: np.ndarray, first_row: int) -> Screen:
    """One block of rows (simulation units; rows numbered from `first_row`) through the
    row-wise guards (`check_values`)."""
    missing = np.isnan(v) | self.ignored
    fits = np.all(missing[:, None] == (self.removed | self.ignored)[None], axis=-1).any(1)
    finite = fits & ~np.isinf(v).any(1)
    ok = np.flatnonzero(finite)
    absolute = ok[absolute_rows(v[ok], self.vh, self.drift)] if len(ok) else ok
    with np.errstate(over="ignore", invalid="ignore"):
      z = (v[ok] - np.ravel(self.mean)) / np.ravel(self.std)
      typical = np.nanmedian(np.abs(z), axis=1) if len(ok) else np.zeros(0)
      size = np.sqrt(np.nanmean(v[ok] ** 2, axis=1) / np.nanmean(np.ravel(self.std) ** 2))
    far = ~(typical < FAR_OFF)
    return Screen(
      bad=first_row + np.flatnonzero(~finite),
      ok=first_row + ok,
      absolute=first_row + absolute,
      far=first_row + ok[far],
      far_typical=float(np.max(typical[far])) if far.any() else 0.0,
      sizes=size[size > 0],  # a frame equal to its reference is no evidence either way
    )

  def _judge(
    self, screens: list[Screen], where: str, skip_bad: bool, units: str, hints: Hints = RECONSTRUCT
  ) -> np.ndarray:
    """The rows of screened blocks that can be imaged, or one error naming every refused row
    of them (the first ones and how many in all), the units judged on all their frames."""
    pick = lambda name: np.concatenate([getattr(s, name) for s in screens])
    bad = pick("bad")
    if len(bad) and not skip_bad:
      sets_note = (
        f"; a missing value is NaN, and only as one of the model's {len(self.removed)} "
        "electrode-removal sets (config.simulator.removals)"
        if self.vector
        else ""
      )
      sets_note += "".join(f"; {s.note}" for s in screens if s.note)
      raise InputError(
        f"{where}: rows {listed(bad)} hold NaN, infinite or out-of-range (beyond float32's "
        f"3.4e38) voltages{sets_note}; {hints.skip}"
      )
    ok = pick("ok")
    if len(ok) == 0:
      raise InputError(f"{where}: every row holds NaN or infinite voltages")
    absolute = pick("absolute")
    if len(absolute):
      raise InputError(
        f"{where}: rows {listed(absolute)} are absolute voltages (the empty tank's "
        f"pattern dominates them), or carry a constant offset, not difference voltages: "
        f"{hints.reference}"
      )
    other_units = (
      f"units {units!r} (voltage ratio {self.voltage_ratio:g}) say; give the device's "
      "units (uef2017, ktc2023, simulated) or its voltage and current ratios, or "
      "difference voltages (frames minus a reference frame) if these are absolute"
      if units
      else "simulation units (a device's values divided by its calibrated gain)"
    )
    far = pick("far")
    if len(far):
      raise InputError(
        f"{where}: rows {listed(far)} are ~{max(s.far_typical for s in screens):.3g} standard "
        f"deviations from the training data's voltages (expected a few): they are in other "
        f"units than {other_units}"
      )
    sizes = pick("sizes")
    if len(sizes) and np.median(sizes) < FAR_SMALL:
      raise InputError(
        f"{where}: its frames are typically ~{float(np.median(sizes)):.2g} of the training "
        "data's spread of difference voltages (real differences are 0.1-1 of it, a device's "
        f"noise alone over {FAR_SMALL:g}): far too small, they are in other units than "
        f"{other_units}"
      )
    return ok

  @functools.cached_property
  def vh(self) -> np.ndarray:
    """The empty tank's values (R,) of the model's measuring system, in simulation units."""
    if self.vector:
      from cdeit_jax.eit import calibration

      return calibration.homogeneous(self.layout, self.layout.z)
    return np.asarray(eit.default_simulator(layout=self.layout).vh, np.float64)


def check_source(recording, device: layout.Layout, where: str) -> None:
  """A frames file that is a device file (`infer.frames.Recording.device`: its own currents and
  measured pairs) must measure as `device`, the one whose values the run reads (the model's,
  or a translated run's device): another protocol's file is refused in one line naming both."""
  given = getattr(recording, "device", None)
  if given is not None and not given.measures_as(device):
    raise InputError(
      f"{where}: a device file of {given.describe()}, where the run reads "
      f"{device.describe()}: its currents or measured pairs are not the run's, so its values "
      "are another protocol's; give frames of the device the run was made for"
    )


def float32(a: np.ndarray) -> np.ndarray:
  """`a` as float32; values beyond its range become infinite (refused by the guards, which
  name them) without numpy's overflow warning."""
  with np.errstate(over="ignore"):
    return a.astype(np.float32)
