"""Device mesh and shardings: one `data` axis over every device of every host.

The batch is split over `data`; parameters and optimizer state are replicated, or (FSDP-style,
`config.shard_params`) split over `data` along their largest divisible dimension.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA = "data"


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all devices of all processes, in process order)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA))


def fsdp_spec(shape: tuple[int, ...], size: int, min_elements: int = 2**12) -> P:
  """Split the largest dimension divisible by `size`; small arrays stay replicated."""
  if size == 1 or int(np.prod(shape, dtype=np.int64)) < min_elements:
    return P()
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % size == 0:
      spec = [None] * len(shape)
      spec[dim] = DATA
      return P(*spec)
  return P()


def state_shardings(tree: Any, mesh: Mesh, shard_params: bool = False) -> Any:
  """NamedShardings for a pytree of arrays (or ShapeDtypeStructs)."""
  size = mesh.shape[DATA]

  def one(x):
    if not shard_params or not hasattr(x, "shape"):
      return replicated(mesh)
    return NamedSharding(mesh, fsdp_spec(tuple(x.shape), size))

  return jax.tree.map(one, tree)
