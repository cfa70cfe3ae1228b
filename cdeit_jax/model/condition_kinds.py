"""What a CDEIT reads as its condition (`config.model.cond`), as one value: the published EIM
(`"eim"`: 208 voltages of CDEIT's 16 electrodes as a 16 x 16 image), the EIM with linear
reconstructions of the same voltages beside it (`"eim+linear"`, physics-informed), or the linear
reconstructions alone of any measuring system's values (`"linear"`: (B, R) standardised values,
NaN where missing; `eit.conditioning`).

Each kind is one small object of the `Condition` interface, resolved once from its name (`of`,
by `checkpoints.loading.resolve` into the `model.system.ModelSystem` a command hands down), that
the network, the data sources, the FLOP count and fine-tuning's channel rules ask instead of
comparing names; a fourth kind is one more class here, registered in `KINDS`. This is the one
module that knows the names.
"""

from __future__ import annotations

from typing import Any

from cdeit_jax.common.errors import InputError


class Condition:
  """The interface: what the network's input holds and the module that computes it."""

  name: str
  eim = False  # the upsampled EIM is an input channel (CDEIT's 208 voltages as a 16 x 16 image)
  linear = False  # linear reconstructions of the voltages are input channels
  reads_values = False  # the condition is the device's values (B, R), any measuring system's

  def shape(self, num_values: int, cond_size: int) -> tuple[int, ...]:
    """One example's condition shape: (R,) values or the (cond_size, cond_size, 1) EIM."""
    return (num_values,) if self.reads_values else (cond_size, cond_size, 1)

  def eim_channels(self, in_channels: int) -> int:
    return in_channels if self.eim else 0

  def check(self, device, priors: tuple, current_carrying: str) -> None:
    """An InputError for settings this kind cannot take (`config.model`)."""
    from cdeit_jax.eit import layout as layout_lib

    if self.reads_values:
      return
    if priors != ("noser",):
      raise InputError(
        f'cond_priors {priors!r} apply to cond "linear" (a device\'s values); cond '
        f'{self.name!r} has NOSER images alone: leave config.model.cond_priors at ("noser",)'
      )
    if device.signature != layout_lib.preset("cdeit16").signature:
      raise InputError(
        f"cond {self.name!r} reads CDEIT's 16-electrode EIM; the measuring system "
        f'{device.describe()} needs cond "linear" (config.model.cond)'
      )
    if current_carrying != "use":
      raise InputError(
        f'current_carrying {current_carrying!r} applies to cond "linear" (a device\'s values); '
        f"cond {self.name!r} reads CDEIT's 208, none on a current-carrying electrode "
        "(config.model.current_carrying)"
      )

  def conditioner(self, system, alphas: tuple, grid: int, priors: tuple) -> Any:
    """The module that computes the linear channels from the condition (None: none)."""
    return None

  def keeps_channels_of(self, start: Condition) -> bool:
    """Whether a model of this kind starts from one of `start`'s by dropping the start's EIM
    channel and keeping its linear images (fine-tuning a 16-electrode model for any device)."""
    return start.eim and start.linear and self.linear and not self.eim


class EIM(Condition):
  """The published model: the EIM alone."""

  name = "eim"
  eim = True


class EIMAndLinear(Condition):
  """The EIM with one NOSER-weighted Tikhonov image of the same 208 voltages per level."""

  name = "eim+linear"
  eim = linear = True

  def conditioner(self, system, alphas, grid, priors):
    from cdeit_jax.eit import conditioning

    return conditioning.LinearConditioner(alphas, layout=system.device)


class Linear(Condition):
  """Any measuring system's values, read through their linear reconstructions alone (one
  channel per prior and level), electrode sets removed as the system's rule says."""

  name = "linear"
  linear = reads_values = True

  def conditioner(self, system, alphas, grid, priors):
    from cdeit_jax.eit import conditioning

    return conditioning.LayoutConditioner(
      system.device,
      alphas,
      removals=system.removals,
      grid=grid,
      current_carrying=system.current_carrying,
      priors=priors,
    )


KINDS: dict[str, Condition] = {k.name: k for k in (EIM(), EIMAndLinear(), Linear())}


def of(name: str) -> Condition:
  """The condition kind `name` (`config.model.cond`); an InputError naming the kinds."""
  if name not in KINDS:
    raise InputError(f"config.model.cond: {name!r} is not one of {tuple(KINDS)}")
  return KINDS[name]
