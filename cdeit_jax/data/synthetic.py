"""The simulated distribution: one description (`config.simulator`) and one generator of examples,
shared by `python -m cdeit_jax.simulate` (files) and the simulator data source (examples made on
the devices every step, `cdeit_jax.data.simulator_source`), so that both give the same examples.

Example i of split s is a function of (seed, s, i) alone: its key is
fold_in(fold_in(key(seed), s), i); the phantom is drawn from fold_in(key, 0)
(`eit.phantom.draw_params`), the noise on the homogeneous and inhomogeneous voltages from
fold_in(key, 1), and the measuring system (`eit.system.draw`, unless `config.simulator.system` is
the nominal one) from fold_in(key, 2), or from key(device_seed) for every example (its drift
still per example, from fold_in(key, 3)). The output does not depend on the batch, the devices
or the hosts that compute it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cdeit_jax.common.errors import InputError

SPLITS = ("train", "valid", "test")
# 1: phantoms drawn with numpy (cdeit-jax 0.1); 2: drawn in JAX (draw_params); 3: seven kinds,
# up to 6 inclusions, the measuring system drawn per example (`config.simulator.system`)
FORMAT_VERSION = 3


def _fields(cls, node: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
  """`config.simulator.<name>` as keyword arguments of the dataclass `cls` (lists as tuples);
  an unknown field is an InputError naming it."""
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(node) - fields
  if unknown:
    raise InputError(
      f"config.simulator.{name}: unknown fields {sorted(unknown)}; known: {sorted(fields)}"
    )
  return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in node.items()}


def phantom_spec(sim: ml_collections.ConfigDict):
  """The `PhantomSpec` of `config.simulator.phantom`, checked."""
  from cdeit_jax.eit import PhantomSpec

  values = _fields(PhantomSpec, sim.phantom, "phantom")
  if sim.snr_db is not None and not (
    isinstance(sim.snr_db, (int, float)) and math.isfinite(sim.snr_db)
  ):
    raise InputError(
      f"config.simulator.snr_db={sim.snr_db!r}: give a finite number of dB, or "
      "None for noise-free voltages"
    )
  spec = PhantomSpec(**values)
  try:
    spec.validate()
  except InputError as e:
    raise InputError(f"config.simulator.phantom: {e} (have {dict(sim.phantom)})") from None
  return spec


def system_spec(sim: ml_collections.ConfigDict):
  """The `SystemSpec` of `config.simulator.system`, checked."""
  from cdeit_jax.eit.spec import SystemSpec

  spec = SystemSpec(**_fields(SystemSpec, sim.system, "system"))
  try:
    spec.validate()
  except InputError as e:
    raise InputError(f"config.simulator.system.{e}") from None
  return spec


def settings_json(sim: ml_collections.ConfigDict) -> dict[str, Any]:
  """What determines the examples, every default spelled out (simulate.json), so that a folder
  never extends with other defaults (of a later version) than it was made with."""
  from cdeit_jax.eit import layout, tikhonov

  # the system as its preset or device file names it (the file's own contact impedance: the
  # record is the file's, whatever the config's)
  device = layout.resolve(_layout_name(sim))
  cdeit16 = device.signature == layout.preset("cdeit16").signature
  return {
    "format": FORMAT_VERSION,
    "seed": int(sim.seed),
    "snr_db": None if sim.snr_db is None else float(sim.snr_db),
    "contact_impedance": float(sim.contact_impedance),
    "phantom": _phantom_json(phantom_spec(sim)),
    "system": _system_json(system_spec(sim)),
    "tikhonov_alpha": float(sim.tikhonov_alpha or tikhonov.DEFAULT_ALPHA),
    # another measuring system than CDEIT's (recorded only then: older folders stay valid), with
    # its electrodes and patterns as arrays (a device file changed since is not the folder's)
    **({} if cdeit16 else {"layout": _layout_name(sim), "device": device.record()}),
  }


def _phantom_json(spec) -> dict[str, Any]:
  """The phantom record; `target` only when it is not "label", the resistive range only when
  it is given (folders made before they existed drew label targets and one range, and stay
  extendable)."""
  record = dataclasses.asdict(spec)
  if record["target"] == "label":
    del record["target"]
  if (record["resistive_v_min"], record["resistive_v_max"]) == (0, 0):
    del record["resistive_v_min"], record["resistive_v_max"]
  return record


def _system_json(spec) -> dict[str, Any]:
  """The system record, ranges as lists; `drift` only when it is drawn (folders made before
  it existed drew none and stay extendable)."""
  record = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(spec).items()}
  if tuple(record["drift"]) == (1.0, 1.0):
    del record["drift"]
  return record


def _layout_name(sim: ml_collections.ConfigDict) -> str:
  return str(sim.get("layout") or "cdeit16")


def example_key(seed: int, split: str | jax.Array, index: jax.Array) -> jax.Array:
  """The key of example `index` of `split` (a name, or its position in SPLITS, maybe traced)."""
  split_id = SPLITS.index(split) if isinstance(split, str) else split
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), split_id), index)


class Generator:
  """Examples of `config.simulator`: (split, indices) -> ys (n, R) difference voltages in
  volts (R = 208 for CDEIT's system, the layout's count for another) and xs (n, 128, 128) label
  images; traceable, for use inside jit and shard_map."""

  def __init__(self, sim: ml_collections.ConfigDict):
    from cdeit_jax import config_lib, eit

    self.seed = int(sim.seed)
    self.snr_db = None if sim.snr_db is None else float(sim.snr_db)
    self.spec = phantom_spec(sim)
    self.system = system_spec(sim)
    self.layout = config_lib.measuring_system(sim, None)
    # one simulator per measuring system, shared in the process (compiled once)
    self.sim = eit.default_simulator(layout=self.layout)
    # Built now, outside any trace: built first inside shard_map they would carry its mesh.
    jax.block_until_ready(self.sim.vh)
    if self.nominal:
      self.sim.support_cem(self.spec.max_radius)
    else:
      from cdeit_jax.eit import system

      passive = system.num_electrodes(self.system, self.layout) > self.layout.num_electrodes
      self.sim.drawn_cem(passive, self.spec.max_radius)

  @property
  def nominal(self) -> bool:
    """Whether every example is measured by the one fixed system (the condensed fast path)."""
    from cdeit_jax.eit.mesh import spec_for

    return self.system.is_nominal(spec_for(self.layout).width_deg)

  def systems(self, keys: jax.Array):
    """The measuring systems (`eit.system.draw`) of the examples with these keys: each its own,
    or with `device_seed` >= 0 the one system of that seed, its drift still per example."""
    from cdeit_jax.eit import system

    seed = self.system.device_seed
    draw = lambda k: system.draw(k, self.system, self.layout.z, self.layout)
    if seed < 0:
      return jax.vmap(lambda k: draw(jax.random.fold_in(k, 2)))(keys)
    device = draw(jax.random.key(seed))
    # one device, but each measurement its own drift
    drift = jax.vmap(lambda k: system.draw_drift(jax.random.fold_in(k, 3), self.system))(keys)
    return dataclasses.replace(
      jax.tree.map(lambda a: jnp.broadcast_to(a, (len(keys),) + a.shape), device), drift=drift
    )

  def _batch(self, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    from cdeit_jax.eit import phantom as ph

    params = jax.vmap(lambda k: ph.draw_params(jax.random.fold_in(k, 0), self.spec))(keys)
    noise = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    noise = noise if self.snr_db is not None else None
    if self.nominal:
      ys = self.sim.phantom_voltages(params, self.snr_db, noise, self.spec.max_radius)
    else:
      ys = self.sim.system_difference(
        self.sim.phantom_conductivity(params),
        self.systems(keys),
        self.snr_db,
        noise,
        self.spec.max_radius,
      )
    return ys, jax.vmap(lambda p: ph.render_image(p, target=self.spec.target))(params)

  def examples(
    self, split: str | jax.Array, indices: jax.Array, *, batched: bool = True
  ) -> tuple[jax.Array, jax.Array]:
    """`batched=False` computes one example at a time (`lax.map`): on CPU with several host
    devices it must be, see `per_example`."""
    keys = jax.vmap(lambda i: example_key(self.seed, split, i))(indices)
    if batched:
      return self._batch(keys)
    ys, xs = jax.lax.map(lambda k: self._batch(k[None]), keys)
    return ys[:, 0], xs[:, 0]


def per_example(platform: str) -> bool:
  """Whether `Generator.examples` must run one example at a time on `platform`.

  On CPU, jaxlib's LAPACK kernels (the CEM's Cholesky and triangular solves) split a batch of
  matrices over XLA's shared intra-op thread pool and block their thread until the pieces are
  done (`ParallelBatchMap` in jaxlib/cpu/lapack_kernels.cc). With several host devices (e.g.
  8 fake CPU devices), each device's program runs such a kernel on a thread of that pool at the
  same time: all pool threads block waiting for pieces that no free thread is left to run (seen
  as 8 threads in `absl::BlockingCounter::Wait` under `lapack_spotrf_ffi` in gdb). A single
  matrix per call runs inline, so on CPU the examples are solved one at a time (the devices
  still run in parallel); on GPU and TPU the batch is solved at once.
  """
  return platform == "cpu"


@functools.lru_cache(maxsize=8)
def _generator(settings: str) -> Generator:
  import json

  # Built outside any mesh context (the training loop runs under `jax.set_mesh`): arrays made
  # there are placed on that mesh, and such constants cannot enter shard_map's per-device code.
  with jax.set_mesh(None):
    return Generator(ml_collections.ConfigDict(json.loads(settings)))


def generator(sim: ml_collections.ConfigDict) -> Generator:
  """One shared `Generator` per setting (its simulator's factorisations are built once)."""
  return _generator(sim.to_json())


def example_arrays(
  sim: ml_collections.ConfigDict,
  split: str,
  indices: np.ndarray,
  mesh: jax.sharding.Mesh,
  pad_to: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """Host arrays (ys (n, R), xs (n, 128, 128)) of examples `indices` of `split`, computed on
  the devices of `mesh` (each its share of the batch), replicated to every host. Batches are
  padded to `pad_to` (and to a multiple of the devices) so that one compilation serves all."""
  from cdeit_jax.common import sharding as shd

  gen = generator(sim)
  fn = _examples_fn(gen, mesh, per_example(mesh.devices.flat[0].platform))
  n, size = len(indices), mesh.size
  total = -(-max(n, pad_to) // size) * size
  padded = np.concatenate([indices, np.full(total - n, indices[-1] if n else 0)])
  ys, xs = fn(
    np.int32(SPLITS.index(split)), jax.device_put(padded.astype(np.int32), shd.replicated(mesh))
  )
  return np.asarray(ys)[:n], np.asarray(xs)[:n]


@functools.lru_cache(maxsize=16)
def _examples_fn(gen: Generator, mesh: jax.sharding.Mesh, one_at_a_time: bool):
  from jax.sharding import PartitionSpec as P

  from cdeit_jax.common import sharding as shd

  local = jax.shard_map(
    lambda split, idx: gen.examples(split, idx, batched=not one_at_a_time),
    mesh=mesh,
    in_specs=(P(), P(shd.DATA)),
    out_specs=P(shd.DATA),
  )
  return jax.jit(local, out_shardings=shd.replicated(mesh))
