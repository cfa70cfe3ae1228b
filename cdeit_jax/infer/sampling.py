"""The compiled sampler of `Reconstructor` (so of eval.py and the reconstruct command) and of the
ahead-of-time check: one jitted, batch-sharded function of (weights, cond, example indices,
sample indices, key), compiled per batch size; `BucketedSampler` runs it over a stream of calls
of any size, each padded to a bucket compiled once.

Row r's noise comes from fold_in(fold_in(key, sample[r]), index[r]), so a reconstruction does not
depend on the batch it is in, the batch size, or the number of devices or hosts, and the K
samples of an example may share a batch or not.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax.common import compat, logs
from cdeit_jax.common import device_memory as dm
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import pipeline
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
  values_of=None,
):
  """One jitted sampler: (weights, cond, example indices, sample indices, key) -> images,
  batch-sharded (a segmenter's: its class probabilities (B, H, W, 3), whatever the rest).

  With `correction_graphdef` (of a `conditioning.DataConsistency`), `weights` is the pair
  (model state, correction state) and every step's x0 is made consistent with the data. With
  `symmetric_stats` (the condition's mean and std), sample k of a frame is drawn for the tank
  turned or mirrored by the k-th of its 8 symmetries (`symmetry.GROUP`) and turned back, so
  that the mean of 8 samples is symmetric (`config.sampling.symmetric`): CDEIT's EIM, or with
  `values_of` (a `Layout`) the values of that device (a model that reads its values)."""

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
        if values_of is None:
          cond = symmetry.turn_conditions(cond, element, *symmetric_stats)
        else:
          cond = symmetry.turn_values(cond, element, *symmetric_stats, values_of)
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


class BucketedSampler:
  """A sampler (`make_sampler`) over a stream of batches of any size: each call padded to a
  bucket, the devices times 1, 2, 4, ... up to the largest batch (`max_batch`: the one that fits,
  `compile_sampler`, or `batch_size`), each bucket compiled once, the largest now and the others
  when a call first needs them, so a stream never recompiles. `fn` is called with `weights`
  (replicated over `mesh`) and `key`; each row of a call is one image (H, W, C) = `shape` of a
  condition of `cond_shape`."""

  def __init__(
    self,
    fn,
    weights,
    mesh,
    key: jax.Array,
    shape: tuple,
    cond_shape: tuple,
    num_examples: int,
    batch_size: int | None = None,
  ):
    self.fn, self.weights, self.mesh, self.key = fn, weights, mesh, key
    self.shape, self.cond_shape = shape, cond_shape
    compiled, self.max_batch = compile_sampler(
      fn, weights, mesh, num_examples, batch_size, cond_shape=cond_shape
    )
    self._compiled: dict[int, Callable] = {self.max_batch: compiled}

  @property
  def buckets(self) -> list[int]:
    """The global batch sizes a call is padded to: the devices times 1, 2, 4, ... and the
    largest batch."""
    n = self.mesh.devices.size
    out, g = [], n
    while g < self.max_batch:
      out.append(g)
      g *= 2
    return out + [self.max_batch]

  @property
  def compiled_buckets(self) -> list[int]:
    return sorted(self._compiled)

  def _bucket(self, rows: int) -> int:
    """The global batch `rows` rows (at most `max_batch`) are padded to."""
    return next(b for b in self.buckets if b >= rows)

  def executable(self, rows: int) -> tuple[int, Callable]:
    """(bucket, its compiled sampler) of a call of `rows` rows, compiled when first needed."""
    bucket = self._bucket(rows)
    if bucket not in self._compiled:
      self._compiled[bucket] = compile_batch(
        self.fn, self.weights, self.mesh, bucket, self.cond_shape
      )
      log.debug(f"sampler compiled for a batch of {bucket}")
    return bucket, self._compiled[bucket]

  def prepare(self, rows: int) -> list[int]:
    """Compile now every bucket that `rows` rows (frames times samples) in calls of at most
    `max_batch` will use, so that timing starts after compilation; returns those buckets."""
    sizes = {min(self.max_batch, rows - lo) for lo in range(0, rows, self.max_batch)}
    return sorted({self.executable(r)[0] for r in sizes})

  def sample_local(
    self, cond: np.ndarray, index: np.ndarray, sample: np.ndarray | int
  ) -> np.ndarray:
    """One sampler call on this host's rows (every host its equal share, in process order, of
    a global batch of at most `max_batch` rows): conditions (b, 16, 16, 1), example indices
    (b,), sample indices (b,) or one for all; returns the global batch's images, (B, H, W, C),
    on every host (padding rows included)."""
    b = len(cond)
    sample = np.broadcast_to(np.asarray(sample, np.int32), (b,))
    bucket, run = self.executable(b * jax.process_count())
    per_host = bucket // jax.process_count()
    if b < per_host:  # pad this host's share to the bucket's (the padding rows are dropped)
      pad = per_host - b
      cond = np.concatenate([cond, np.repeat(cond[:1], pad, 0)])
      index, sample = (np.concatenate([a, np.repeat(a[:1], pad)]) for a in (index, sample))
    g = pipeline.to_global(
      {
        "cond": np.asarray(cond, np.float32),
        "index": np.asarray(index, np.int32),
        "sample": np.asarray(sample, np.int32),
      },
      self.mesh,
    )
    return gather(run(self.weights, g["cond"], g["index"], g["sample"], self.key))

  def sample_rows(
    self,
    cond: np.ndarray,
    index: np.ndarray,
    sample: np.ndarray,
    progress: Callable[[int], None] | None = None,
    full: bool = False,
  ) -> np.ndarray:
    """Images (R, H, W, C) of R rows given whole on every host (conditions, example indices,
    sample indices), in calls of at most `max_batch` rows, each host sampling its share; with
    `full`, every call padded to `max_batch` (one compiled size for a whole test set)."""
    out = np.empty((len(cond), *self.shape), np.float32)
    p, procs = jax.process_index(), jax.process_count()
    for lo in range(0, len(cond), self.max_batch):
      hi = min(len(cond), lo + self.max_batch)
      rows = np.arange(lo, lo + (self.max_batch if full else self._bucket(hi - lo)))
      rows = np.minimum(rows, hi - 1)  # padding repeats the last row
      mine = rows.reshape(procs, -1)[p]
      imgs = self.sample_local(cond[mine], index[mine], sample[mine])
      out[lo:hi] = imgs[: hi - lo]
      if progress is not None:
        progress(hi - lo)
    return out
