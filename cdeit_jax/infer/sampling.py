"""The compiled sampler of `Reconstructor` (so of eval.py and the reconstruct command) and of the
ahead-of-time check: one jitted, batch-sharded function of (weights, cond, example indices,
sample indices, key), compiled per batch size.

Row r's noise comes from fold_in(fold_in(key, sample[r]), index[r]), so a reconstruction does not
depend on the batch it is in, the batch size, or the number of devices or hosts, and the K
samples of an example may share a batch or not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common import compat, logs
from cdeit_jax.common import device_memory as dm
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import symmetry
from cdeit_jax.model.diffusion import Diffusion

log = logs.log.getChild("eval")


def make_sampler(
  graphdef,
  diffusion: Diffusion,
  steps: int,
  eta: float,
  shape,
  mesh,
  correction_graphdef=None,
  symmetric_stats: tuple | None = None,
  symmetric_layout=None,
):
  """One jitted sampler: (weights, cond, example indices, sample indices, key) -> images,
  batch-sharded (a segmenter's: its class probabilities (B, H, W, 3), whatever the rest).

  With `correction_graphdef` (of a `conditioning.DataConsistency`), `weights` is the pair
  (model state, correction state) and every step's x0 is made consistent with the data. With
  `symmetric_stats` (the condition's mean and std), sample k of a frame is drawn for the tank
  turned or mirrored by the k-th of its 8 symmetries (`symmetry.GROUP`) and turned back, so
  that the mean of 8 samples is symmetric (`config.sampling.symmetric`): CDEIT's EIM, or with
  `symmetric_layout` the values of that device (a model that reads its values)."""

  def sample(weights, cond, index, sample, key):
    correct = None
    if correction_graphdef is not None:
      weights, correction = weights
      correct = nnx.merge(correction_graphdef, correction)
    model = nnx.merge(graphdef, weights)

    def draw(model, cond):  # the diffusion sampler (a segmenter's one pass does not call it)
      keys = jax.vmap(lambda k, i: jax.random.fold_in(jax.random.fold_in(key, k), i))(sample, index)
      if symmetric_stats is not None:
        element = sample % len(symmetry.GROUP)
        if symmetric_layout is None:
          cond = symmetry.turn_conditions(cond, element, *symmetric_stats)
        else:
          cond = symmetry.turn_values(cond, element, *symmetric_stats, symmetric_layout)
      images = diffusion.sample_fn(
        model, cond, steps=steps, eta=eta, key=keys, shape=shape, correct=correct
      )
      return images if symmetric_stats is None else symmetry.turn_back(images, element)

    return model.system.output.sample(model, cond, draw)

  b = shd.batch_sharded(mesh)
  return jax.jit(
    sample, in_shardings=(shd.replicated(mesh), b, b, b, shd.replicated(mesh)), out_shardings=b
  )


def compile_sampler(
  sampler,
  weights,
  mesh,
  num_examples: int,
  batch_size: int | None = None,
  *,
  cond_shape: tuple = (16, 16, 1),
  fraction: float = 0.8,
):
  """Compile `sampler` for the largest batch that fits the devices; returns (executable, batch).

  `batch_size` (global) is taken as given. Otherwise per-device batches 8, 4, 2, 1 (never more
  than the examples need) are compiled in turn until the compiler's memory analysis says the
  program fits `fraction` of the memory budget (`device_memory.budget`)."""
  n = mesh.devices.size
  if batch_size is not None:
    if batch_size < 1 or batch_size % n:
      raise InputError(
        f"--config.sampling.batch_size={batch_size}: must be a positive multiple of the {n} devices"
      )
    candidates = [batch_size // n]
  else:
    most = max(1, -(-num_examples // n))
    candidates = sorted({min(b, most) for b in (8, 4, 2, 1)}, reverse=True)
  budget, sharing = dm.budget(jax.local_devices()[0])
  compiled = None
  for per_device in candidates:
    g = per_device * n
    try:
      compiled = compile_batch(sampler, weights, mesh, g, cond_shape)
    except jax.errors.JaxRuntimeError as e:  # the compiler itself refuses what cannot fit (TPU)
      if batch_size is not None or per_device == 1 or not compat.is_out_of_memory(e):
        raise
      log.info(f"sampler: batch {g} does not fit ({str(e).splitlines()[0][:120]}); trying smaller")
      continue
    need = dm.memory_of(compiled).get("peak_bytes")
    if (
      batch_size is not None
      or need is None
      or budget is None
      or need * sharing <= fraction * budget
    ):
      return compiled, g
    log.info(
      f"sampler: batch {g} needs ~{need * sharing / 2**30:.1f} GiB of "
      f"{budget / 2**30:.1f} GiB available; trying a smaller batch"
    )
  log.warning(f"sampler: even batch {n} may not fit the available memory; trying it anyway")
  return compiled, n


def compile_batch(sampler, weights, mesh, global_batch: int, cond_shape: tuple = (16, 16, 1)):
  """`sampler` compiled for one global batch size and one example's condition shape."""
  cond = jax.ShapeDtypeStruct((global_batch, *cond_shape), jnp.float32)
  index = jax.ShapeDtypeStruct((global_batch,), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.set_mesh(mesh):
    return sampler.lower(weights, cond, index, index, key).compile()


def gather(x: jax.Array) -> np.ndarray:
  """A global array as one host array on every process."""
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
