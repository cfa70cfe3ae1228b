"""KTC2023 answers from a sampler's samples: the rules that turn K images (label units, log10 of
the conductivity ratio) into the challenge's class map (0 water, 1 resistive, 2 conductive), or
a segmenter's class probabilities into it.

The challenge scores each class's mask by an SSIM with a window of sigma 80 pixels, so a class
answered where the truth has none costs up to half the target's point however few its pixels:
whether each class is there matters as much as where. A rule is written as a string, the
config's `eval.answer_rule`:

  mean:T            the mean image above +T conductive, below -T resistive (the first rule)
  vote:T:Q          per pixel, the fraction of samples above +T (conductive) and below -T
                    (resistive): the class of the larger fraction where it reaches Q
  argmax            a segmenter's (config.model.output "classes"): per pixel its most
                    probable class
  argmax:water=W    the same after water's probability is weighted by W (W < 1 answers an
                    object where water is only a little more probable; on KTC2023's
                    simulations 0.9 scored higher, docs/ktc2023.md)
  ...:area=A        any of them, then a class covering under A of the tank is dropped
                    (answered as water)

e.g. `vote:0.3:0.5:area=0.01`, `argmax:water=0.9:area=0.005`. `probabilities` gives the
per-pixel class fractions that eval.py keeps beside the answer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cdeit_jax.common.errors import InputError


@dataclasses.dataclass(frozen=True)
class AnswerRule:
  kind: str  # "mean" or "vote" (of samples), "argmax" (of a segmenter's probabilities)
  threshold: float = 0.0  # label units (mean, vote)
  vote: float = 0.5  # the fraction of samples a class needs (vote)
  min_area: float = 0.0  # a class covering less of the tank is dropped
  water: float = 1.0  # the weight of water's probability before the argmax (argmax)

  def __post_init__(self):
    if self.kind not in ("mean", "vote", "argmax"):
      raise InputError(f"answer rule {self.kind!r}: mean, vote or argmax")
    if self.kind != "argmax" and not (np.isfinite(self.threshold) and self.threshold > 0):
      raise InputError(f"answer rule threshold {self.threshold}: a number > 0 (label units)")
    if not 0 < self.vote <= 1:
      raise InputError(f"answer rule vote fraction {self.vote}: between 0 and 1")
    if not 0 <= self.min_area < 1:
      raise InputError(f"answer rule area={self.min_area}: a fraction of the tank in [0, 1)")
    if not (np.isfinite(self.water) and self.water > 0):
      raise InputError(f"answer rule water={self.water}: a weight > 0")
    if self.kind != "argmax" and self.water != 1.0:
      raise InputError(f"answer rule water={self.water}: only argmax weighs water's probability")

  @classmethod
  def parse(cls, text: str, where: str = "--config.eval.answer_rule") -> AnswerRule:
    """The rule a string names (the module's docstring); an InputError naming `where`."""
    parts = [p.strip() for p in str(text).split(":")]
    named, plain = {"area": [], "water": []}, []
    for p in parts:
      key, eq, value = p.partition("=")
      if eq and key in named:
        named[key].append(value)
      else:
        plain.append(p)
    try:
      kind, numbers = plain[0], [float(p) for p in plain[1:]]
      min_area = float(named["area"][0]) if named["area"] else 0.0
      water = float(named["water"][0]) if named["water"] else 1.0
      if any(len(v) > 1 for v in named.values()) or not (
        (kind == "mean" and len(numbers) == 1)
        or (kind == "vote" and len(numbers) == 2)
        or (kind == "argmax" and not numbers)
      ):
        raise ValueError
      return cls(kind, *numbers, min_area=min_area, water=water)
    except (ValueError, IndexError, InputError) as e:
      why = f" ({e})" if isinstance(e, InputError) else ""
      raise InputError(
        f"{where}={text!r}: not an answer rule{why}; write mean:T, vote:T:Q or "
        "argmax[:water=W], optionally followed by :area=A (e.g. vote:0.3:0.5:area=0.01)"
      ) from None

  def __str__(self) -> str:
    head = {
      "mean": f"mean:{self.threshold:g}",
      "vote": f"vote:{self.threshold:g}:{self.vote:g}",
      "argmax": "argmax" + (f":water={self.water:g}" if self.water != 1.0 else ""),
    }[self.kind]
    return head + (f":area={self.min_area:g}" if self.min_area else "")

  @property
  def of_classes(self) -> bool:
    """Whether it answers from a segmenter's class probabilities (else from samples)."""
    return self.kind == "argmax"

  def check_model(self, segmenter: bool, where: str = "--config.eval.answer_rule") -> None:
    """An InputError naming `where` when the rule does not read what the model gives."""
    if segmenter != self.of_classes:
      what = (
        "a segmenter (config.model.output 'classes'), which answers with argmax[:water=W][:area=A]"
        if segmenter
        else "a sampler of images, which answers with mean:T or vote:T:Q[:area=A]"
      )
      raise InputError(f"{where}={self}: the model is {what}")

  def evidence(self, r) -> np.ndarray:
    """What the rule answers from in a `Reconstruction`: its samples, or a segmenter's class
    probabilities."""
    self.check_model(r.probabilities is not None, "the answer rule")
    return r.probabilities if self.of_classes else r.samples

  def answer_of(self, r) -> np.ndarray:
    """(N, H, W) uint8 class maps of a `Reconstruction` (`evidence`)."""
    return self.answer(self.evidence(r))

  def class_fractions(self, r) -> tuple[np.ndarray, np.ndarray]:
    """(resistive, conductive) per pixel of a `Reconstruction`, as the rule reads them: a
    segmenter's class probabilities, or the fractions of the samples beyond the rule's
    threshold (`probabilities`)."""
    evidence = self.evidence(r)
    if self.of_classes:
      return evidence[..., 1], evidence[..., 2]
    return probabilities(evidence, self.threshold)

  def answer(self, samples: np.ndarray) -> np.ndarray:
    """(..., H, W) uint8 class map of samples (K, ..., H, W) in label units, or with argmax of
    class probabilities (..., H, W, 3) (water's weighted by `water`)."""
    samples = np.asarray(samples, np.float64)
    if self.kind == "argmax":
      out = np.argmax(samples * np.array([self.water, 1.0, 1.0]), axis=-1)
    elif self.kind == "mean":
      mean = samples.mean(0)
      out = np.where(mean > self.threshold, 2, np.where(mean < -self.threshold, 1, 0))
    else:
      p_res, p_con = probabilities(samples, self.threshold)
      out = np.where(
        (p_con >= self.vote) & (p_con > p_res),
        2,
        np.where((p_res >= self.vote) & (p_res > p_con), 1, 0),
      )
    out = out.astype(np.uint8)
    if self.min_area > 0:
      from cdeit_jax.eit.phantom import disk_mask

      disk = disk_mask(out.shape[-1]).sum()
      for c in (1, 2):
        small = (out == c).sum(axis=(-2, -1), keepdims=True) < self.min_area * disk
        out[(out == c) & small] = 0
    return out


def probabilities(samples: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
  """(resistive, conductive) per-pixel fractions of samples (K, ..., H, W) below -threshold and
  above +threshold."""
  samples = np.asarray(samples)
  return (samples < -threshold).mean(0), (samples > threshold).mean(0)
