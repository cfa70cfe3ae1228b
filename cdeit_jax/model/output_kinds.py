"""What a CDEIT outputs (`config.model.output`), as one value: the published image sampler
(`"image"`: a denoiser the diffusion sampler runs, images in label units) or the class segmenter
(`"classes"`: per-pixel water, resistive and conductive in one deterministic pass,
`model.classes`).

Each kind is one small object of the `Output` interface, resolved once from its name (`of`), that
the network, the train and eval steps, the sampler, the compile-only check, the Reconstructor and
the challenge's answers call instead of comparing names: how many sampler steps and samples a
frame takes, and how one sampler run's outputs become a frame's answer (the fields of the
Reconstructor's `Reconstruction`: images, std, samples, class probabilities). A third kind is
one more class here, registered in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError

Array = jax.Array


class Output:
  """The interface: the network's channels, the training and validation losses, one sampler
  call, its steps and samples, and what a frame's answer is."""

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

  def diffusion_steps(self, steps: int) -> int:
    """The diffusion sampler's steps a sample takes for the config's `steps` (a one-pass kind
    runs none: 0)."""
    return 0 if self.one_pass else int(steps)

  def samples_per_frame(self, num_samples: int) -> int:
    """The samples drawn of a frame when `num_samples` are asked for (a one-pass kind is
    deterministic: one is all)."""
    return 1 if self.one_pass else int(num_samples)

  def reconstruction(
    self, outputs: np.ndarray, frames: int, std_scale: float, keep_samples: bool
  ) -> dict[str, np.ndarray | None]:
    """What `frames` frames' answers are, from one sampler run's outputs (frames x
    `samples_per_frame` rows (H, W, C), a frame's samples together): the fields of the
    Reconstructor's `Reconstruction` (`images` (N, H, W), and any of `std` (N, H, W), its
    calibrated per-pixel uncertainty, times `std_scale`; `samples` (K, N, H, W), with
    `keep_samples`; `probabilities` (N, H, W, classes)); a field left out is None."""
    raise NotImplementedError


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

  def reconstruction(self, outputs, frames, std_scale, keep_samples):
    """The mean of a frame's K samples and their std (K > 1), `summarise`'s."""
    samples = outputs[..., 0].reshape(frames, -1, *outputs.shape[1:3]).swapaxes(0, 1)
    images, std = summarise(samples)
    if std is not None:
      std = std * np.float32(std_scale)
    return {"images": images, "std": std, "samples": samples if keep_samples else None}


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

  def reconstruction(self, outputs, frames, std_scale, keep_samples):
    """The class probabilities (water, resistive, conductive), and per pixel the mean
    p_con - p_res and the std sqrt(p_con + p_res - (p_con - p_res)^2) of a class contrast
    (-1, 0, +1) drawn from them."""
    p = np.asarray(outputs, np.float32)
    mean = p[..., 2] - p[..., 1]
    std = np.sqrt(np.maximum(p[..., 2] + p[..., 1] - mean * mean, 0.0)) * np.float32(std_scale)
    return {"images": mean, "std": std, "probabilities": p}


def summarise(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
  """(mean, std) over the samples' first axis (K): the one rule for eval.py and the API (float32
  as numpy computes it, so both give the same bits); std None for K = 1."""
  return samples.mean(0), (samples.std(0) if len(samples) > 1 else None)


KINDS: dict[str, Output] = {k.name: k for k in (ImageOutput(), ClassOutput())}


def of(name: str) -> Output:
  """The output kind `name` (`config.model.output`); an InputError naming the kinds."""
  if name not in KINDS:
    raise InputError(f"output {name!r} must be one of {tuple(KINDS)} (config.model.output)")
  return KINDS[name]
