"""Training data behind one interface (`TrainingData`), so that the training loop never asks
where its examples come from: npz folders (`FileData`, `config.data.source = "files"`) or the
simulator on the devices (`simulator_source.SimulatorData`, `"simulator"`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import ml_collections
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.common import fileio
from cdeit_jax.data import pipeline, sources
from cdeit_jax.model.system import ModelSystem


class TrainingData(Protocol):
  """What the training loop needs of its data."""

  mean: np.ndarray  # the statistics the condition is standardised with (checkpointed)
  std: np.ndarray
  valid: Any  # random-access validation examples (`pipeline.eval_batches`)
  calibration: Any  # random-access training examples for the physics-informed
  # condition's calibration; None when resuming or fine-tuning (the checkpoint has it)
  checkpoint_item: Any  # the iterator whose position is saved with each step, or None
  description: str  # one line for the run's log

  def batch(self, step: jax.Array) -> dict[str, jax.Array]:
    """The global batch (`cond`, `target`, sharded over the batch axis) of train step `step` (a
    device scalar)."""
    ...


class FileData:
  """npz folders `config.data.path/{train_split,valid_split}`: a shuffled, repeated grain stream
  whose position is checkpointed; validation standardised with the training set's statistics."""

  def __init__(
    self,
    cfg: ml_collections.ConfigDict,
    mesh: jax.sharding.Mesh,
    system: ModelSystem,
    checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
    start_stats: tuple[np.ndarray, np.ndarray] | None = None,
  ):
    d, device = cfg.data, system.device
    common = dict(
      voltage_ratio=d.voltage_ratio,
      current_ratio=d.current_ratio,
      skip_bad=d.skip_bad_files,
      cache=d.cache,
      num_values=device.num_values,
      vector_cond=system.reads_values,
    )
    train = sources.NpzSource(
      fileio.join(d.path, d.train_split),
      d.units,
      d.stats if start_stats is None else start_stats,  # a fine-tuning's: over the folder's
      checkpoint_stats=checkpoint_stats,
      stats_flag="--config.data.stats",
      **common,
    )
    self.valid = sources.NpzSource(
      fileio.join(d.path, d.valid_split), d.units, (train.mean, train.std), **common
    )
    self.mean, self.std = train.mean, train.std
    # the condition's calibration is measured unless a resumed run restores it (a fine-tuning's
    # start's then replaces it, all but the channels the start lacks)
    self.calibration = train if checkpoint_stats is None else None
    self.description = (
      f"data: {len(train)} training and {len(self.valid)} validation examples from {d.path}"
    )
    self._mesh = mesh
    self.checkpoint_item = iter(pipeline.train_dataset(train, cfg.batch_size, d, device))

  def batch(self, step: jax.Array) -> dict[str, jax.Array]:
    del step  # the stream's position is the iterator's (checkpointed)
    host = next(self.checkpoint_item)  # the step needs cond and target only (not the indices)
    return pipeline.to_global({k: host[k] for k in ("cond", "target")}, self._mesh)


def _simulator_data(cfg, mesh, system, checkpoint_stats, stop, start_stats) -> TrainingData:
  from cdeit_jax.data import simulator_source

  fixed = checkpoint_stats if checkpoint_stats is not None else start_stats
  return simulator_source.SimulatorData(cfg, mesh, system, fixed, stop)


def _file_data(cfg, mesh, system, checkpoint_stats, stop, start_stats) -> TrainingData:
  return FileData(cfg, mesh, system, checkpoint_stats, start_stats)


# How each training source of the config's table (`config_lib.SOURCES`) opens; a new source is
# one entry there and one here.
OPENERS: dict[str, Callable[..., TrainingData]] = {
  "files": _file_data,
  "simulator": _simulator_data,
}


def open_training_data(
  cfg: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  system: ModelSystem,
  checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
  stop: Callable[[], bool] | None = None,
  start_stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> TrainingData:
  """The source `config.data.source` names (`config_lib.training_source`, opened by `OPENERS`),
  standardised with `checkpoint_stats` on resume, or with `start_stats`, those of the checkpoint
  a fine-tuning starts from (`loading.start_inputs`); either way the condition's calibration is
  the checkpoint's, not computed. `system` is what the model is of, resolved once by the caller
  (`loading.resolve`): the files' frames are its device's values. `stop` (training's signal
  flag) may end the simulator's statistics early (`simulator_source.Stopped`)."""
  source = config_lib.training_source(cfg)
  return OPENERS[source.name](cfg, mesh, system, checkpoint_stats, stop, start_stats)
