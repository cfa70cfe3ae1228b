"""The segmenter's objective (`CDEIT(output="classes")`): KTC2023's answer is a class per pixel
(water, resistive, conductive) and its score looks at nothing else, so a network can be trained
on the class maps directly, per-pixel cross-entropy against the label image's classes
(`eit.phantom.class_map`), instead of denoising images and thresholding samples
(docs/ktc2023.md, "A segmenter"). One pass per frame, no sampler."""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
import optax

from cdeit_jax.eit.phantom import class_map

Array = jax.Array


class Segmenter(Protocol):
  def segment(self, cond: Array) -> Array: ...


def per_example_loss(model: Segmenter, x0: Array, cond: Array) -> Array:
  """(B,) mean cross-entropy over the pixels of each example: the logits of `model.segment`
  against the classes of the label images x0 (B, H, W, 1)."""
  logits = model.segment(cond).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, class_map(x0[..., 0]))
  return jnp.mean(ce.reshape(ce.shape[0], -1), axis=1)


def loss(model: Segmenter, x0: Array, cond: Array, mask: Array | None = None) -> Array:
  """The training loss: the mean of `per_example_loss` over the batch (`mask` (B,) weights
  examples, the mean over the unmasked ones)."""
  per_example = per_example_loss(model, x0, cond)
  if mask is None:
    return jnp.mean(per_example)
  return jnp.sum(per_example * mask) / jnp.maximum(jnp.sum(mask), 1)


def probabilities(model: Segmenter, cond: Array) -> Array:
  """(B, H, W, 3) float32 class probabilities: water, resistive, conductive."""
  return jax.nn.softmax(model.segment(cond).astype(jnp.float32), axis=-1)
