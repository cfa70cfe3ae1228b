"""What a CDEIT outputs (`config.model.output`), as one value: the published image sampler
(`"image"`: a denoiser the diffusion sampler runs, images in label units) or the class segmenter
(`"classes"`: per-pixel water, resistive and conductive in one deterministic pass,
`model.classes`).

Each kind is one small object of the `Output` interface, resolved once from its name (`of`), that
the network, the train and eval steps, the sampler, the compile-only check, the Reconstructor and
the challenge's answers call instead of comparing names; a third kind is one more class here,
registered in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from cdeit_jax.common.errors import InputError

Array = jax.Array


class Output:
  """The interface: the network's channels, the training and validation losses, one sampler
  call, and how the answers are read."""

  name: str
  one_pass = False  # deterministic: one pass per frame, no sampler steps, one sample
  gives_classes = False  # answers per-pixel class probabilities (KTC2023's argmax rules)

  def noisy_channels(self, in_channels: int) -> int:
    """Channels of the noisy image the network reads beside its condition."""
    raise NotImplementedError

  def out_channels(self, in_channels: int) -> int:
    raise NotImplementedError

  def check(self, cond) -> None:
    """An InputError for a condition (`model.condition_kinds`) this kind cannot read."""

  def loss(self, model, diffusion, x0: Array, t: Array, cond: Array, noise: Array) -> Array:
    """The training loss of a micro-batch (x0 the targets, t and noise the diffusion's draws)."""
    raise NotImplementedError

  def per_example_loss(self, model, diffusion, x0: Array, t: Array, cond: Array, noise: Array):
    """(B,) the validation loss of each example (t and noise as `loss` takes them)."""
    raise NotImplementedError

  def sample(self, model, cond: Array, draw: Callable[[Any, Array], Array]) -> Array:
    """One sampler call's outputs (B, H, W, C) for conditions `cond`; `draw(model, cond)` runs
    the diffusion sampler (the caller's steps, keys and symmetries)."""
    raise NotImplementedError

  def sampler_steps(self, steps: int) -> int:
    """The network passes of one sample for the sampler's `steps`."""
    return 1 if self.one_pass else int(steps)


class ImageOutput(Output):
  """The published model: x0-prediction trained on the diffusion's noisy images."""

  name = "image"

  def noisy_channels(self, in_channels: int) -> int:
    return in_channels

  def out_channels(self, in_channels: int) -> int:
    return in_channels

  def loss(self, model, diffusion, x0, t, cond, noise):
    return diffusion.loss(model, x0, t, cond, noise)

  def per_example_loss(self, model, diffusion, x0, t, cond, noise):
    """L1 of the x0-prediction."""
    pred = model(diffusion.q_sample(x0, t, noise), t, cond)
    return jnp.mean(jnp.abs(pred - x0).reshape(pred.shape[0], -1), axis=1)

  def sample(self, model, cond, draw):
    return draw(model, cond)


class ClassOutput(Output):
  """The segmenter (`model.classes`): cross-entropy on the label images' classes."""

  name = "classes"
  one_pass = True
  gives_classes = True

  def noisy_channels(self, in_channels: int) -> int:
    return 0  # no noisy image: the condition alone

  def out_channels(self, in_channels: int) -> int:
    from cdeit_jax.eit.phantom import NUM_CLASSES  # (configs read without the physics)

    return NUM_CLASSES

  def check(self, cond) -> None:
    if not cond.linear:
      raise InputError(
        'output "classes" reads the condition alone: give it the linear reconstructions '
        '(config.model.cond "eim+linear" or "linear")'
      )

  def loss(self, model, diffusion, x0, t, cond, noise):
    from cdeit_jax.model import classes

    return classes.loss(model, x0, cond)

  def per_example_loss(self, model, diffusion, x0, t, cond, noise):
    from cdeit_jax.model import classes

    return classes.per_example_loss(model, x0, cond)

  def sample(self, model, cond, draw):
    from cdeit_jax.model import classes

    return classes.probabilities(model, cond)


KINDS: dict[str, Output] = {k.name: k for k in (ImageOutput(), ClassOutput())}


def of(name: str) -> Output:
  """The output kind `name` (`config.model.output`); an InputError naming the kinds."""
  if name not in KINDS:
    raise InputError(f"output {name!r} must be one of {tuple(KINDS)} (config.model.output)")
  return KINDS[name]
