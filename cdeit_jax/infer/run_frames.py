"""What a run's frames are, as one value resolved when the run is opened (`run_opening.open_run`):
the device they are of and how they become the values its model reads. `Frames` is the model's
own measuring system (the identity); `translated_run.TranslatedDevice` another device's, whose
frames are translated into the model's system (a run of `python -m cdeit_jax.translate`). The
Reconstructor, its guards, eval.py's evaluation and sources and the reconstruct command take
the value and call it; none of them asks which of the two it is.
"""

from __future__ import annotations

import numpy as np

from cdeit_jax.eit import layout


class Frames:
  """Frames of the model's own measuring system `device`: its values, read as they are."""

  # whether a frame's missing values (NaN) are left out wherever they lie (a translation
  # infers them), rather than allowed only as one of the model's electrode-removal sets
  may_miss = False

  def __init__(self, device: layout.Layout):
    self._device = device

  @property
  def device(self) -> layout.Layout:
    """The device the frames are of (in its order, R values a frame)."""
    return self._device

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """The model's values (N, R_model) of the frames' values (N, R) in simulation units."""
    return values

  def check_reference(self, reference: np.ndarray, where: str) -> None:
    """What a reference frame (R,) must be beyond finite values: nothing for the model's own."""

  def guards(self, own, units: layout.Layout):
    """The guards of these frames, given the model's own (`frame_guards.FrameGuards`) and the
    frames' `units`: the model's own guards."""
    return own

  def removed(self, removed: np.ndarray) -> np.ndarray:
    """The values (R,) bool an evaluation leaves out, given its removal set's of the model's
    system (`removed`)."""
    return removed

  def ignored(self, ignored: np.ndarray) -> np.ndarray:
    """The values (R,) bool the model leaves out whatever they hold, given the model's."""
    return ignored

  def reads_values(self, vector: bool) -> bool:
    """Whether a recording's frames are conditioned as a vector of values (`vector`: whether
    the model reads its system's values as one) rather than as CDEIT's EIM."""
    return vector

  def source(self, recording, mean: np.ndarray, std: np.ndarray):
    """The examples eval.py samples of a recording's source (`infer.recording`): its own."""
    return recording

  def check_kind(self, kind, workdir: str) -> None:
    """Refuse a kind of test data (`data_kinds.Kind`) these frames cannot be: none here."""

  def reading(self) -> str:
    """How a Reconstructor of these frames reads them, for its repr ("": as they are)."""
    return ""
