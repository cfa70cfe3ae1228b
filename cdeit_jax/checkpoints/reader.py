"""The one reader of a run's checkpoints for inference (eval.py, the Reconstructor, the
reconstruct command): a workdir (or one of its step folders) is opened once, which lists its
steps and their validation losses once and keeps one CheckpointManager; the steps to try come
in order with the reason for that order; each step's metadata is read once into a typed record;
loading a model returns the steps it passed over instead of filling in a caller's dict.

  with reader.open_run("runs/demo") as run:
    meta, skipped = run.first_readable()           # Meta: step, config, statistics, weights
    system = loading.resolve(meta.config, meta.record)   # what the model is of, once
    loaded = run.load(system, weights="ema", sharding=s)  # Loaded: model, meta, skipped, reason
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from cdeit_jax.checkpoints import checkpoint, loading
from cdeit_jax.common import fileio


@dataclasses.dataclass(frozen=True)
class Meta:
  """A step's metadata, read and checked once: its step, format, weight sets, normalisation
  statistics (1, 16, 13), its config (the `model` section included) and the stored record."""

  step: int
  format: str
  weights: tuple[str, ...]
  mean: np.ndarray
  std: np.ndarray
  config: ml_collections.ConfigDict
  record: dict[str, Any]

  @classmethod
  def of(cls, record: dict[str, Any]) -> Meta:
    mean, std = checkpoint.meta_stats(record)
    return cls(
      int(record["step"]),
      record["format"],
      tuple(record.get("weights", ())),
      mean,
      std,
      loading.model_config(record),
      record,
    )


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model loaded from the first intact step: the steps passed over ({step: reason}) and why
  the step was the one to load."""

  model: nnx.Module  # the weight set alone (nnx.State) when loaded `weights_only`
  meta: Meta
  skipped: dict[int, str]
  reason: str


class Run:
  """A run's checkpoints opened for reading (`open_run`); close it (or use `with`)."""

  def __init__(self, path: str, step: int | None = None):
    self.workdir, folder_step = checkpoint.locate(path)
    self.asked = step if step is not None else folder_step
    self._mngr = checkpoint.manager(self.workdir, read_only=True)
    self.losses: dict[int, float] = {}
    listed = sorted(self._mngr.all_steps())
    if folder_step is None:  # MissingFile when there is no step, or not the one asked for
      checkpoint.pick_step(self.workdir, listed, step)
    if self.asked is not None:
      self.candidates = [self.asked]
    else:  # the best validated steps first, then the others newest first
      scored = checkpoint.scored_steps(self.workdir, self._mngr)
      self.losses = {s: loss for loss, s in scored}
      ranked = [s for _, s in scored]
      self.candidates = ranked + [s for s in listed[::-1] if s not in ranked]
    self._metas: dict[int, Meta] = {}

  def __enter__(self) -> Run:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    self._mngr.close()

  @property
  def where(self) -> str:
    return fileio.join(self.workdir, checkpoint.CHECKPOINTS)

  def step_dir(self, step: int) -> str:
    return fileio.join(self.where, str(step))

  def meta(self, step: int) -> Meta:
    """The step's metadata (read once; CheckpointError when it cannot be read)."""
    if step not in self._metas:
      self._metas[step] = Meta.of(checkpoint.read_meta(self.workdir, step, mngr=self._mngr))
    return self._metas[step]

  def first_readable(self, start: int | None = None) -> tuple[Meta, dict[int, str]]:
    """(meta, skipped) of the first candidate from `start` on whose metadata reads."""
    _, meta, skipped = checkpoint.first_intact(self._from(start), self.meta, self.where)
    return meta, skipped

  def load(
    self,
    system: loading.ModelSystem,
    *,
    weights: str,
    sharding: jax.sharding.Sharding | None = None,
    start: int | None = None,
    passed: dict[int, str] | None = None,
    weights_only: bool = False,
    **runtime: Any,
  ) -> Loaded:
    """The model of the first candidate from `start` on whose metadata and `weights` load
    completely (`runtime`: the model's runtime keys, as `loading.load_weights` takes them);
    `passed`: steps passed over before, kept in the result's `skipped`; `system`: what the
    command resolved (`loading.resolve`: one run, one system); `weights_only`: the weight set alone
    (`nnx.Param` state) in `model`, no model built."""

    def load(step: int) -> tuple[nnx.Module, Meta]:
      meta = self.meta(step)
      return loading.load_weights(
        self.workdir,
        meta.record,
        system,
        weights=weights,
        sharding=sharding,
        mngr=self._mngr,
        weights_only=weights_only,
        **runtime,
      ), meta

    step, (model, meta), skipped = checkpoint.first_intact(
      self._from(start), load, self.where, passed
    )
    return Loaded(model, meta, skipped, self.reason(step, skipped))

  def reason(self, step: int, skipped: dict[int, str]) -> str:
    """Why `step` is the one used: its place in the order, and the steps passed over."""
    if self.asked is not None:
      why = "asked for"
    elif step in self.losses:
      rank = sorted(self.losses, key=self.losses.get).index(step) + 1
      why = f"validation loss {self.losses[step]:.6g}, rank {rank} of {len(self.losses)} validated"
    elif len(self.candidates) == 1:
      why = "its only step"  # a model folder, an interpolated or imported checkpoint
    else:
      why = "the newest step without a validation loss"
    if skipped:
      why += f" (steps {', '.join(map(str, skipped))} could not be read)"
    return why

  def _from(self, start: int | None) -> list[int]:
    return self.candidates if start is None else self.candidates[self.candidates.index(start) :]


def open_run(path: str, step: int | None = None) -> Run:
  """A run's checkpoints: `path` a workdir (its best validated step first, then the others newest
  first), its `checkpoints/` folder, or one `RUN/checkpoints/STEP` (that step only); `step`
  (`--config.eval.step`) asks for one step of a workdir."""
  return Run(path, step)
