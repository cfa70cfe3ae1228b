"""The simulator as a data source (`config.data.source = "simulator"`): every train step gets
fresh examples of `config.simulator`, made on the devices next to the step, no files, no epochs.

Global batch k holds training examples k*G .. k*G+G-1 of the distribution
(`cdeit_jax.data.synthetic`: example i is a function of (seed, "train", i), the same as file i of
`python -m cdeit_jax.simulate
--num_train`); each device makes its own rows (shard_map over the batch axis), so there is no
host round trip, and the batch depends only on the step, not on the number of devices or hosts,
so a resumed run continues bit for bit (the stream's position is the step: nothing else to save).

The normalisation statistics (and the physics-informed model's calibration) come from the first
`config.simulator.stats_examples` training examples, computed once and stored in the checkpoint;
validation uses the fixed examples 0..`config.simulator.valid_examples`-1 of the valid split.
A `stop` predicate (training's signal flag) is checked before every chunk of the statistics, so
a SIGTERM while they are made (minutes at full size) stops the run within one chunk (`Stopped`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from cdeit_jax.common import logs
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import CdeitError, InputError
from cdeit_jax.data import synthetic
from cdeit_jax.data.sources import ArraySource
from cdeit_jax.eit import measurement
from cdeit_jax.model.system import ModelSystem

_CHUNK = 256  # examples per call when making the fixed sets
PRESET = "simulated"  # the simulator's units


class Stopped(CdeitError):
  """The `stop` predicate turned true while the statistics were being made (nothing saved)."""


def fixed_examples(
  cfg: ml_collections.ConfigDict, split: str, n: int, mesh: jax.sharding.Mesh
) -> tuple[np.ndarray, np.ndarray]:
  """(ys (n, R), xs (n, 128, 128)) host arrays of examples 0..n-1 of `split`."""
  ys, xs = [], []
  for lo in range(0, n, _CHUNK):
    idx = np.arange(lo, min(n, lo + _CHUNK))
    y, x = synthetic.example_arrays(cfg.simulator, split, idx, mesh, pad_to=min(n, _CHUNK))
    ys.append(y)
    xs.append(x)
  return np.concatenate(ys), np.concatenate(xs)


def statistics_examples(
  cfg: ml_collections.ConfigDict,
  n: int,
  mesh: jax.sharding.Mesh,
  stop: Callable[[], bool] | None = None,
):
  """Training examples 0..n-1 as chunks (ys, xs), xs only for the first
  `conditioning.CALIBRATION_EXAMPLES` (None after them): the statistics stream over any n in
  constant memory, with progress (`logs.progress`) when they take more than a few chunks.
  Raises `Stopped` before the next chunk once `stop()` is true."""
  from cdeit_jax.eit.conditioning import CALIBRATION_EXAMPLES

  enabled = n > 8 * _CHUNK and jax.process_index() == 0
  with logs.progress(n, "simulator source: statistics", "example", enabled=enabled) as bar:
    for lo in range(0, n, _CHUNK):
      if stop is not None and stop():
        raise Stopped(f"stopped after {lo} of the {n} statistics examples")
      idx = np.arange(lo, min(n, lo + _CHUNK))
      y, x = synthetic.example_arrays(cfg.simulator, "train", idx, mesh, pad_to=min(n, _CHUNK))
      bar.update(len(idx))
      yield y, (x[: max(0, CALIBRATION_EXAMPLES - lo)] if lo < CALIBRATION_EXAMPLES else None)


class SimulatorData:
  """The training data of `config.simulator` (the `sources.TrainingData` interface): statistics
  (and the physics-informed calibration) from the first `stats_examples` training examples, or
  the checkpoint's on resume; the fixed validation examples; each step's batch made on the
  devices. Nothing goes into the checkpoint: the stream's position is the step."""

  checkpoint_item = None

  def __init__(
    self,
    cfg: ml_collections.ConfigDict,
    mesh: jax.sharding.Mesh,
    system: ModelSystem,
    checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None,
    stop: Callable[[], bool] | None = None,
  ):
    self.reads_values = system.reads_values  # the condition: the values, or their EIM
    if cfg.data.units != PRESET:
      raise InputError(
        f"config.data.units={cfg.data.units!r}: the simulator source makes "
        f"simulated data; use config.data.units='{PRESET}'"
      )
    s = cfg.simulator
    if int(s.valid_examples) < 1:
      raise InputError("config.simulator.valid_examples must be >= 1")
    t0 = time.perf_counter()
    self.calibration = None
    if checkpoint_stats is None:
      if int(s.stats_examples) < 2:
        raise InputError("config.simulator.stats_examples must be >= 2 (a std needs two examples)")
      num_values = synthetic.generator(s).layout.num_values  # the simulated device's
      running, ys, xs = measurement.RunningStats(num_values=num_values), [], []
      for y, x in statistics_examples(cfg, int(s.stats_examples), mesh, stop):
        running.add(y)
        if x is not None:
          ys.append(y[: len(x)])
          xs.append(x)
      self.mean, self.std = running.result("config.simulator.stats_examples")
      ys, xs = np.concatenate(ys), np.concatenate(xs)
      self.calibration = self._examples(cfg, "train", ys, xs)
    else:
      self.mean, self.std = checkpoint_stats
    ys, xs = fixed_examples(cfg, "valid", int(s.valid_examples), mesh)
    self.valid = self._examples(cfg, "valid", ys, xs)
    made = (
      f"{int(s.stats_examples)} statistics and"
      if self.calibration is not None
      else "statistics from the checkpoint,"
    )
    self.description = (
      f"simulator source: {made} {len(self.valid)} validation examples made "
      f"in {time.perf_counter() - t0:.1f} s"
    )
    self._batch = batch_fn(cfg, system, mesh, self.mean, self.std)

  def _examples(self, cfg, split: str, ys: np.ndarray, xs: np.ndarray) -> ArraySource:
    name = f"simulator {split} examples 0..{len(ys) - 1}"
    return ArraySource(ys, xs, self.mean, self.std, name=name, vector_cond=self.reads_values)

  def batch(self, step: jax.Array) -> dict[str, jax.Array]:
    return self._batch(step)


def batch_fn(
  cfg: ml_collections.ConfigDict,
  system: ModelSystem,
  mesh: jax.sharding.Mesh,
  mean: np.ndarray,
  std: np.ndarray,
) -> Callable[[jax.Array], dict[str, jax.Array]]:
  """Jitted `step -> {"cond", "target"}`: the global batch of `step`, sharded over the batch axis
  like the files' batches, each device making its rows (conditioned as the files' examples,
  `measurement.condition`). `step` is a device scalar (the state's), so no value goes through
  the host."""
  gen = synthetic.generator(cfg.simulator)
  g = cfg.batch_size
  one_at_a_time = synthetic.per_example(mesh.devices.flat[0].platform)
  mean = jnp.asarray(np.ravel(mean), jnp.float32)
  std = jnp.asarray(np.ravel(std), jnp.float32)
  ratio, _ = measurement.resolve_ratios(PRESET)
  vector = system.reads_values

  def rows(indices):
    ys, xs = gen.examples("train", indices, batched=not one_at_a_time)
    if vector:  # cond "linear": the standardised values themselves
      cond = (ys.astype(jnp.float32) / ratio - mean) / std
    else:
      lay = measurement.cdeit16()  # the EIM is of CDEIT's 16 x 13 values (model.network)
      cond, _, _ = measurement.condition(ys.astype(jnp.float32), ratio, mean, std, lay)
    return {"cond": cond, "target": xs.astype(jnp.float32)[..., None]}

  local = jax.shard_map(rows, mesh=mesh, in_specs=P(shd.DATA), out_specs=P(shd.DATA))

  def batch(step: jax.Array) -> dict[str, jax.Array]:
    return local(step.astype(jnp.int32) * g + jnp.arange(g, dtype=jnp.int32))

  return jax.jit(batch, in_shardings=shd.replicated(mesh), out_shardings=shd.batch_sharded(mesh))
