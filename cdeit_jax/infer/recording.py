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
from cdeit_jax.data import stats as stats_lib
from cdeit_jax.eit import reference_match
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.measurement import IMAGE_SIZE
from cdeit_jax.infer import evaluate, run_frames
from cdeit_jax.infer import frames as frames_files
from cdeit_jax.infer.frame_guards import Hints, check_source, listed

# what eval.py's refusals of a recording's frames ask for: the file holds frames and reference
HINTS = Hints(
  reference=(
    "store the empty tank's frame in the file as `reference` (np.savez(..., frames=..., "
    "reference=...)), so that each frame minus it is scored"
  ),
  same="the file's `reference`",
  skip="remove them from the file",
)


class RecordingSource(sources.ArraySource):
  """The examples of a frames file (`sources.ArraySource`'s items, as `sources.NpzSource`'s):
  each frame's difference from the reference, in the device's `units`, conditioned with the
  model's statistics; NaN only where the evaluated removal set (`removed`, (R,) bool) leaves a
  value out, or on a value the model ignores (`ignored`, (R,) bool: the current-carrying
  electrodes' under `config.model.current_carrying="drop"`, which a frame may hold or not), or
  anywhere where the run's frames may miss values (`frames.may_miss`: a translated run's
  device's); its reference frame checked as the frames ask (`frames.check_reference`).
  `absent` (R,) bool: the ignored values that a frame of the file lacks (anyone it lacks where
  the frames may miss values)."""

  baselines = False  # no stored classical reconstructions (Tikhonov is computed)

  def __init__(
    self,
    path: str,
    frames: run_frames.Frames,
    units: Layout,
    mean: np.ndarray,
    std: np.ndarray,
    removed: np.ndarray,
    vector_cond: bool,
    ignored: np.ndarray | None = None,
  ):
    device = frames.device
    with frames_files.Recording(path, device.num_values, device.describe()) as r:
      check_source(r, device, path)
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
    if reference is not None:  # a translated run's: its empty tank, as calibrated
      frames.check_reference(reference, f"{path}: its reference frame")
    finite = reference is None or np.isfinite(reference[~removed]).all()
    if not (finite or frames.may_miss):
      raise InputError(
        f"{path}: the reference frame holds NaN or infinite values; give the empty tank's frame"
      )
    if reference is not None:  # frames of the reference's tank, protocol, sign and units
      reference_match.check_frames(v, reference, path, f"{path}: its reference frame", HINTS.same)
    # in float64: frames and reference are large beside their difference
    dv = (v if reference is None else v - reference[None]).astype(np.float32)
    ignored = np.zeros_like(removed) if ignored is None else ignored
    missing = np.isnan(dv) | ignored[None]
    wrong = np.flatnonzero((missing != (removed | ignored)[None]).any(1))
    if len(wrong) and not frames.may_miss:  # a translated run's: left out (`translated_run`)
      raise InputError(
        f"{path}: rows {listed(wrong)} miss other values than the evaluated electrode-removal "
        f"set leaves out ({int(removed.sum())} values, --config.eval.removal); give frames of "
        "one set and its --config.eval.removal"
      )
    super().__init__(dv, targets, mean, std, name=fileio.resolve(path), vector_cond=vector_cond)
    self.units, self.voltage_ratio = units.name, units.gain
    self.dv = self._ys
    # the values some frame lacks that it may lack (Tikhonov's of the device leaves them out)
    self.absent = (ignored | frames.may_miss) & np.isnan(dv).any(0)
    self.files = [f"frame_{i:05d}" for i in range(len(dv))]


class RecordingEvaluator(evaluate.Evaluator):
  """`evaluate.Evaluator` over a frames file: its source, and the Reconstructor's guards."""

  def open_source(self, meta, vector: bool) -> sources.ArraySource:
    """The recording's examples, as the run's frames make them (`run_frames.Frames.source`: a
    translated run's conditioned on their translation), standardised with the checkpoint's
    statistics or those --config.eval.stats names."""
    self.statistics = stats_lib.resolve_stats(None, self.cfg.eval.stats, (meta.mean, meta.std))
    mean, std = self.statistics.mean, self.statistics.std
    src = RecordingSource(
      self.data_path,
      self.frames,
      self.units,
      mean,
      std,
      self.removed,
      self.frames.reads_values(vector),
      self.frames.ignored(self.system.ignored),
    )
    return self.frames.source(src, mean, std)

  def check_data(self) -> None:
    """The Reconstructor's guards, once it is compiled (`_compile`): an absolute frame is told
    by its likeness to the simulated empty tank, not by its scale."""

  def _compile(self, model) -> None:
    super()._compile(model)
    self.rec.guards.check_frames(self.src.dv[: self.n], self.data_path, hints=HINTS)


def run(kind, path: str, data_path: str, out: str, overrides=None, units=None) -> dict[str, Any]:
  """`data_kinds`' recording."""
  return evaluate.run(kind, path, data_path, out, overrides, units, evaluator=RecordingEvaluator)
