"""grain pipelines that feed one global batch sharded over every host and device: the shuffled,
repeated training stream, evaluation batches that cover every example once, and host batches
made into global arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grain
import jax
import numpy as np

from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data.npz_files import DatasetError
from cdeit_jax.data.sources import NpzSource
from cdeit_jax.eit import symmetry
from cdeit_jax.eit.layout import Layout

_TRAIN_KEYS = ("cond", "target", "index")


def _drop_name(ex: dict) -> dict:
  return {k: ex[k] for k in _TRAIN_KEYS}


def local_batch_size(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise InputError(
      f"global batch {global_batch} does not divide over {jax.process_count()} processes"
    )
  return global_batch // jax.process_count()


class _HostRows(grain.MapDataset):
  """This host's rows of every global batch of `parent` (a global example stream).

  Global batch k is parent[k*G : (k+1)*G]; host p gets its rows p*B .. p*B+B-1, so the hosts'
  local batches, concatenated in process order, are the global batch whatever the process count.
  """

  def __init__(self, parent: grain.MapDataset, global_batch: int, per_host: int, process: int):
    super().__init__(parent)
    self._g, self._b, self._p = global_batch, per_host, process
    self._len = (len(parent) // global_batch) * per_host

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    k, j = divmod(index, self._b)
    return self._parents[0][k * self._g + self._p * self._b + j]


def train_dataset(
  source: NpzSource, global_batch: int, opts: Any, layout: Layout
) -> grain.IterDataset:
  """Shuffled (seeded, reshuffled each epoch), repeated, batched host share of the global batch.

  `opts` is `config.data`: `seed`, `num_threads` (reader threads per process), `prefetch`
  (batches per process), `num_workers` (grain worker processes; 0 = in-process), `augment`
  (each example turned and mirrored by one of the tank's eight symmetries of the measuring
  system `layout`, `cdeit_jax.eit.symmetry`; a device without them is
  refused).

  The example order depends only on the seed, not on the number of hosts: each host reads only
  the examples of its rows of each global batch.
  """
  per_host = local_batch_size(global_batch)
  if len(source) < global_batch:
    raise DatasetError(
      f"{source.path}: {len(source)} examples, fewer than one global batch of {global_batch}"
    )
  ds = grain.MapDataset.source(source).shuffle(seed=opts.seed).repeat()
  if opts.augment:  # a fresh symmetry each epoch: grain seeds it by stream index
    ds = ds.random_map(symmetry.Augment(source, layout), seed=opts.seed)
  ds = ds.map(_drop_name)
  ds = _HostRows(ds, global_batch, per_host, jax.process_index())
  ds = ds.batch(per_host, drop_remainder=True)
  it = ds.to_iter_dataset(
    grain.ReadOptions(
      num_threads=opts.num_threads, prefetch_buffer_size=max(opts.prefetch, opts.num_threads)
    )
  )
  if opts.num_workers > 0:
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside an absl app
      flags.FLAGS.mark_as_parsed()  # (library use, tests) mark the defaults as parsed
    it = it.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=opts.num_workers, per_worker_buffer_size=opts.prefetch
      )
    )
  return it


def eval_indices(n: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices, mask) of shape (num_batches, local_batch) for this host.

  Global batch k holds examples k*G .. k*G+G-1; host p takes the p-th block of each, so that the
  hosts' local batches, concatenated in process order, are the global batch. Padding (mask 0)
  repeats example 0.
  """
  per_host = local_batch_size(global_batch)
  num_batches = -(-n // global_batch)
  k = np.arange(num_batches)[:, None]
  pos = k * global_batch + jax.process_index() * per_host + np.arange(per_host)[None]
  mask = pos < n
  return np.where(mask, pos, 0), mask


def eval_batches(
  source: NpzSource, global_batch: int, keys: Sequence[str] = _TRAIN_KEYS, limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
  """Host batches covering every example (or the first `limit`) exactly once across hosts,
  with `mask` and `index`."""
  n = len(source) if limit is None else min(len(source), limit)
  idx, mask = eval_indices(n, global_batch)
  for b in range(idx.shape[0]):
    exs = [source[int(i)] for i in idx[b]]
    batch = {k: np.stack([e[k] for e in exs]) for k in keys}
    batch["mask"] = mask[b].astype(np.float32)
    batch["index"] = idx[b].astype(np.int32)
    yield batch


def to_global(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """Host batch -> global jax.Arrays sharded over the mesh's data axis (leading dimension)."""
  sharding = shd.batch_sharded(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in batch.items()
    if np.asarray(v).dtype.kind != "U"
  }
