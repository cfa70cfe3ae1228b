"""The simulator as a data source (`config.data.source = "simulator"`): every train step gets
fresh examples of `config.simulator`, made on the devices next to the step, no files, no epochs.

Global batch k holds training examples k*G .. k*G+G-1 of the distribution (`cdeit_jax.synthetic`:
example i is a function of (seed, "train", i), the same as file i of `python -m cdeit_jax.simulate
--num_train`); each device makes its own rows (shard_map over the batch axis), so there is no
host round trip, and the batch depends only on the step, not on the number of devices or hosts,
so a resumed run continues bit for bit (the stream's position is the step: nothing else to save).

The normalisation statistics (and the physics-informed model's calibration) come from the first
`config.simulator.stats_examples` training examples, computed once and stored in the checkpoint;
validation uses the fixed examples 0..`config.simulator.valid_examples`-1 of the valid split.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from cdeit_jax import sharding as shd
from cdeit_jax import synthetic
from cdeit_jax.data import ArraySource, eim
from cdeit_jax.errors import InputError
from cdeit_jax.protocol import IMAGE_SIZE, NUM_ELECTRODES, NUM_MEASUREMENTS, STATS_SHAPE

_CHUNK = 256  # examples per call when making the fixed sets


def fixed_examples(cfg: ml_collections.ConfigDict, split: str, n: int, mesh: jax.sharding.Mesh
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(ys (n, 208), xs (n, 128, 128)) host arrays of examples 0..n-1 of `split`."""
  ys, xs = [], []
  for lo in range(0, n, _CHUNK):
    idx = np.arange(lo, min(n, lo + _CHUNK))
    y, x = synthetic.example_arrays(cfg.simulator, split, idx, mesh, pad_to=min(n, _CHUNK))
    ys.append(y)
    xs.append(x)
  return np.concatenate(ys), np.concatenate(xs)


def statistics(ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-measurement mean and std (N-1) in float64, shaped (1, 16, 13) as the authors'."""
  if len(ys) < 2:
    raise InputError("config.simulator.stats_examples must be >= 2 (a std needs two examples)")
  y = np.asarray(ys, np.float64)
  return (y.mean(0).reshape(STATS_SHAPE).astype(np.float32),
          y.std(0, ddof=1).reshape(STATS_SHAPE).astype(np.float32))


def open_sources(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                 checkpoint_stats: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[ArraySource, ArraySource]:
  """(calibration source: the statistics' examples with their mean and std, or an empty source
  carrying the checkpoint's statistics on resume; the fixed validation set)."""
  if cfg.data.preset != "simulated":
    raise InputError(f"config.data.preset={cfg.data.preset!r}: the simulator source makes "
                     "simulated data; use config.data.preset='simulated'")
  s = cfg.simulator
  if checkpoint_stats is None:
    ys, xs = fixed_examples(cfg, "train", int(s.stats_examples), mesh)
    mean, std = statistics(ys)
    train = ArraySource(ys, xs, mean, std, name=f"simulator train examples 0..{len(ys) - 1}")
  else:
    mean, std = checkpoint_stats
    train = ArraySource(np.zeros((0, NUM_MEASUREMENTS), np.float32),
                        np.zeros((0, IMAGE_SIZE, IMAGE_SIZE), np.float32), mean, std,
                        name="simulator (statistics from the checkpoint)")
  if int(s.valid_examples) < 1:
    raise InputError("config.simulator.valid_examples must be >= 1")
  ys, xs = fixed_examples(cfg, "valid", int(s.valid_examples), mesh)
  valid = ArraySource(ys, xs, mean, std, name=f"simulator valid examples 0..{len(ys) - 1}")
  return train, valid


def batch_fn(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, mean: np.ndarray,
             std: np.ndarray) -> Callable[[jax.Array], dict[str, jax.Array]]:
  """Jitted `step -> {"cond", "target"}`: the global batch of `step`, sharded over the batch axis
  like the files' batches, each device making its rows. `step` is a device scalar (the state's),
  so no value goes through the host."""
  gen = synthetic.generator(cfg.simulator)
  g = cfg.batch_size
  one_at_a_time = synthetic.per_example(mesh.devices.flat[0].platform)
  mean = jnp.asarray(np.ravel(mean), jnp.float32)
  std = jnp.asarray(np.ravel(std), jnp.float32)

  def rows(indices):
    ys, xs = gen.examples("train", indices, batched=not one_at_a_time)
    # The "simulated" preset's voltage ratio is 1: the voltages are used as simulated.
    v = (ys.astype(jnp.float32) - mean) / std
    cond = eim(v.reshape(v.shape[0], NUM_ELECTRODES, -1))[..., None]
    return {"cond": cond, "target": xs.astype(jnp.float32)[..., None]}

  local = jax.shard_map(rows, mesh=mesh, in_specs=P(shd.DATA), out_specs=P(shd.DATA))

  def batch(step: jax.Array) -> dict[str, jax.Array]:
    return local(step.astype(jnp.int32) * g + jnp.arange(g, dtype=jnp.int32))

  return jax.jit(batch, in_shardings=shd.replicated(mesh), out_shardings=shd.batch_sharded(mesh))
