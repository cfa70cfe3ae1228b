"""`eval.py --data recording`: one frames file of the model's device, scored as a test set.

The file is what `python -m cdeit_jax.reconstruct` reads (`infer.frames.read`): frames in the
device's order and units, a reference frame (`reference`; without one the frames are
differences), and here also the true images (`targets`, (N, 128, 128) in label units). The one
`evaluate.Evaluator` samples, scores (beside Tikhonov of the same values and the empty image)
and writes it as it does a folder of npz files; the frames pass the Reconstructor's guards
(units, absolute frames, missing values) first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import sources
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import IMAGE_SIZE
from cdeit_jax.infer import evaluate, frames
from cdeit_jax.infer.frame_guards import check_source, listed


class RecordingSource(sources.ArraySource):
  """The examples of a frames file (`sources.ArraySource`'s items, as `sources.NpzSource`'s):
  each frame's difference from the reference, in the device's `units`, conditioned with the
  model's statistics; NaN only where the evaluated removal set (`removed`, (R,) bool) leaves a
  value out, or on a value the model ignores (`ignored`, (R,) bool: the current-carrying
  electrodes' under `config.model.current_carrying="drop"`, which a frame may hold or not);
  of a translated run's device (`translated`, `translated_run.TranslatedDevice`), anywhere, its
  reference frame checked as the run's empty tank.
  `absent` (R,) bool: the ignored values that a frame of the file lacks (a translated run's:
  any value one lacks)."""

  baselines = False  # no stored classical reconstructions (Tikhonov is computed)

  def __init__(
    self,
    path: str,
    system,
    units: Layout,
    mean: np.ndarray,
    std: np.ndarray,
    removed: np.ndarray,
    vector_cond: bool,
    ignored: np.ndarray | None = None,
    translated=None,
  ):
    with frames.Recording(path, system.num_values, system.describe()) as r:
      check_source(r, system, path)
      v, reference, targets = r.rows(0, r.n), r.reference, r.targets()
    if targets is None:
      raise InputError(
        f"{path}: no `targets` (the true images, (N, {IMAGE_SIZE}, {IMAGE_SIZE})), which eval.py "
        "scores the images against; image a recording without them with python -m "
        "cdeit_jax.reconstruct"
      )
    if targets.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
      raise InputError(
        f"{path}: `targets` must be (N, {IMAGE_SIZE}, {IMAGE_SIZE}) images in label units, got "
        f"{targets.shape}"
      )
    if translated is not None and reference is not None:  # the run's empty tank, as calibrated
      translated.check_reference(reference, f"{path}: its reference frame")
    if reference is not None and not np.isfinite(reference[~removed]).all() and not translated:
      raise InputError(
        f"{path}: the reference frame holds NaN or infinite values; give the empty tank's frame"
      )
    # in float64: frames and reference are large beside their difference
    dv = (v if reference is None else v - reference[None]).astype(np.float32)
    ignored = np.zeros_like(removed) if ignored is None else ignored
    missing = np.isnan(dv) | ignored[None]
    wrong = np.flatnonzero((missing != (removed | ignored)[None]).any(1))
    if len(wrong) and translated is None:  # a translated run's: left out (`translated_run`)
      raise InputError(
        f"{path}: rows {listed(wrong)} miss other values than the evaluated electrode-removal "
        f"set leaves out ({int(removed.sum())} values, --config.eval.removal); give frames of "
        "one set and its --config.eval.removal"
      )
    super().__init__(dv, targets, mean, std, name=fileio.resolve(path), vector_cond=vector_cond)
    self.units, self.voltage_ratio = units.name, units.gain
    self.dv = self._ys
    # the values some frame lacks that it may lack (Tikhonov's of the device leaves them out)
    self.absent = (ignored if translated is None else True) & np.isnan(dv).any(0)
    self.files = [f"frame_{i:05d}" for i in range(len(dv))]


class TranslatedSource(sources.ArraySource):
  """A device's recording (`RecordingSource`'s frames) for a translated run: each example's
  condition made of its values translated into the model's system (`eit.translation`); `ys`
  stays the device's own values in simulation units (Tikhonov's, of the device)."""

  baselines = False

  def __init__(self, recording: RecordingSource, translator, mean, std):
    own = recording.dv / np.float32(recording.voltage_ratio)
    super().__init__(
      translator(own), recording._xs, mean, std, name=recording.path, vector_cond=False
    )
    self.own = own
    self.dv, self.absent, self.files = recording.dv, recording.absent, recording.files
    self.units, self.voltage_ratio = "simulated", 1.0

  def __getitem__(self, i: int) -> dict[str, Any]:
    return {**super().__getitem__(i), "ys": self.own[i]}


class RecordingEvaluator(evaluate.Evaluator):
  """`evaluate.Evaluator` over a frames file: its source, and the Reconstructor's guards."""

  def open_source(self, meta, vector: bool) -> RecordingSource | TranslatedSource:
    translated = self.translator is not None
    src = RecordingSource(
      self.data_path,
      self.layout,
      self.units,
      meta.mean,
      meta.std,
      self.removed,
      vector or translated,  # a translated run's device values are conditioned below
      None if translated else self.system.ignored,
      self.translator,
    )
    return TranslatedSource(src, self.translator, meta.mean, meta.std) if translated else src

  def check_data(self) -> None:
    """The Reconstructor's guards, once it is compiled (`_compile`): an absolute frame is told
    by its likeness to the simulated empty tank, not by its scale."""

  def _compile(self, model) -> None:
    super()._compile(model)
    self.rec.guards.check_frames(self.src.dv[: self.n], self.data_path)


def run(kind, path: str, data_path: str, out: str, overrides=None, units=None) -> dict[str, Any]:
  """`data_kinds`' recording."""
  return evaluate.run(kind, path, data_path, out, overrides, units, evaluator=RecordingEvaluator)
