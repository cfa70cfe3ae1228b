"""`ModelSystem`: what a model is of, as one value that a command resolves once
(`checkpoints.loading.resolve`, its one constructor) and hands down to everything below it: the
network (`CDEIT(system=...)`), building and loading models, training's data sources and the
simulator's generator, the reader of a workdir and the Reconstructor. Nothing below a command
resolves a device, a removal rule, a condition or an output kind from names again.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from cdeit_jax.model import condition_kinds, output_kinds

# The `config.model` keys that say what a model is of rather than how it is built: names that
# `resolve` turns into this value (with `config.simulator`'s device and removal rule), not
# keyword arguments of `CDEIT`. Their defaults are the published model's.
MODEL_KEYS = {"cond": "eim", "output": "image", "current_carrying": "use"}


@dataclasses.dataclass(frozen=True, eq=False)
class ModelSystem:
  """The measuring system whose values a model reads (`device`, an `eit.layout.Layout` with its
  contact impedance and units), the electrode-removal rule it was trained with (`removals`;
  "none" for a model of CDEIT's EIM), what it reads (`condition`, `model.condition_kinds`) and
  outputs (`output`, `model.output_kinds`), and what its linear images do with values measured
  on current-carrying electrodes (`current_carrying`, `eit.conditioning.CURRENT_CARRYING`)."""

  device: object  # eit.layout.Layout
  removals: str
  condition: condition_kinds.Condition
  output: output_kinds.Output
  current_carrying: str = "use"

  @property
  def reads_values(self) -> bool:
    """Whether the model reads the device's values (B, R) rather than CDEIT's EIM."""
    return self.condition.reads_values

  @property
  def sets(self) -> tuple[tuple[int, ...], ...]:
    """The removal rule's electrode sets (`eit.layout.removal_sets`)."""
    from cdeit_jax.eit import layout

    return layout.removal_sets(self.removals)

  @functools.cached_property
  def removed(self) -> np.ndarray:
    """(K, R) bool: the values each electrode set takes from the device."""
    from cdeit_jax.eit import conditioning

    return conditioning.removed_values(self.device, self.removals)

  @functools.cached_property
  def ignored(self) -> np.ndarray:
    """(R,) bool: the values the linear images leave out whatever a frame holds there."""
    from cdeit_jax.eit import conditioning

    return conditioning.ignored_values(self.device, self.current_carrying)

  @property
  def units(self):
    """The device in the units its data are in when none are given (`measurement.own_units`)."""
    from cdeit_jax.eit import measurement

    return measurement.own_units(self.device)

  def cond_shape(self, cond_size: int = 16) -> tuple[int, ...]:
    """One example's condition shape: the device's (R,) values or the EIM image."""
    return self.condition.shape(self.device.num_values, cond_size)
