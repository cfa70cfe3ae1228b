"""Ahead-of-time compile checks for TPU topologies, on any machine with libtpu installed.

`python train.py --config CONFIG --compile_topology v5e-8 --workdir DIR` builds the run's exact
train step (same mesh, shardings, donation; the model only as shapes) and the sampler that
`eval.py` uses over compile-only devices of the topology (as MaxText's train_compile.py does),
then writes DIR/compile.json and prints a table. No TPU is needed: `pip install -e ".[tpu]"`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import ml_collections
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import compat, fileio
from cdeit_jax.common import device_memory as dm
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import measurement
from cdeit_jax.infer import sampling
from cdeit_jax.model import flops
from cdeit_jax.train import memory_fit, training

GIB = dm.GIB


@dataclasses.dataclass(frozen=True)
class Topology:
  topology_name: str
  chip_config_name: str  # "megacore" (v4, v5p: one device per chip) or "default"
  chips_per_host_bounds: tuple[int, int, int]
  hbm_bytes: int  # usable HBM per device, as the TPU compiler reports it


_V4, _V5E, _V5P, _V6E = 30.75 * GIB, 15.75 * GIB, 95.74 * GIB, 31.25 * GIB
TOPOLOGIES = {
  "v4-8": Topology("v4:2x2x1", "megacore", (2, 2, 1), _V4),
  "v4-16": Topology("v4:2x2x2", "megacore", (2, 2, 1), _V4),
  "v4-32": Topology("v4:2x2x4", "megacore", (2, 2, 1), _V4),
  "v5e-1": Topology("v5e:1x1", "default", (1, 1, 1), _V5E),
  "v5e-4": Topology("v5e:2x2", "default", (2, 2, 1), _V5E),
  "v5e-8": Topology("v5e:2x4", "default", (2, 4, 1), _V5E),
  "v5e-16": Topology("v5e:4x4", "default", (2, 2, 1), _V5E),
  "v5e-32": Topology("v5e:4x8", "default", (2, 2, 1), _V5E),
  "v5e-64": Topology("v5e:8x8", "default", (2, 2, 1), _V5E),
  "v5p-8": Topology("v5:2x2x1", "megacore", (2, 2, 1), _V5P),
  "v5p-16": Topology("v5:2x2x2", "megacore", (2, 2, 1), _V5P),
  "v5p-32": Topology("v5:2x2x4", "megacore", (2, 2, 1), _V5P),
  "v6e-1": Topology("v6e:1x1", "default", (1, 1, 1), _V6E),
  "v6e-4": Topology("v6e:2x2", "default", (2, 2, 1), _V6E),
  "v6e-8": Topology("v6e:2x4", "default", (2, 4, 1), _V6E),
  "v6e-16": Topology("v6e:4x4", "default", (2, 2, 1), _V6E),
  "v6e-32": Topology("v6e:4x8", "default", (2, 2, 1), _V6E),
}


def topology_devices(name: str) -> list:
  """Compile-only TPU devices of topology `name` (e.g. "v5e-8"); needs libtpu, not a TPU."""
  if name not in TOPOLOGIES:
    raise InputError(f"--compile_topology {name!r}: unknown; use one of {', '.join(TOPOLOGIES)}")
  t = TOPOLOGIES[name]
  try:
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
      platform="tpu",
      topology_name=t.topology_name,
      chip_config_name=t.chip_config_name,
      chips_per_host_bounds=t.chips_per_host_bounds,
      num_slices=1,
      wrap=(False, False, False),
    )
  except Exception as e:  # libtpu missing or incompatible
    raise InputError(
      f"--compile_topology {name}: cannot create TPU compile-only devices "
      f"({type(e).__name__}: {e}); install libtpu matching jax with "
      f'pip install -e ".[tpu]"'
    ) from e
  return list(desc.devices)


# ----------------------------------------------------------------------------- the check


def _compile_sampler(setup: training.Setup, mesh, cfg, global_batch: int) -> dict[str, Any]:
  """eval.py's sampler (`sampling.compile_sampler`) at `global_batch`, compiled for `mesh` (a
  segmenter's: its one pass)."""
  from flax import nnx

  from cdeit_jax.model.network import CDEIT

  m = setup.model_kwargs
  shape = (m["image_size"], m["image_size"], m["in_channels"])
  steps = setup.system.output.sampler_steps(cfg.sampling.steps)
  graphdef, weights = nnx.split(nnx.eval_shape(lambda: CDEIT(**m, rngs=nnx.Rngs(0))))
  stats = (
    np.zeros(measurement.STATS_SHAPE, np.float32),
    np.ones(measurement.STATS_SHAPE, np.float32),
  )
  sampler = sampling.make_sampler(
    graphdef,
    setup.diffusion,
    cfg.sampling.steps,
    cfg.sampling.eta,
    shape,
    mesh,
    symmetric_stats=stats if cfg.sampling.symmetric else None,
  )
  t0 = time.perf_counter()
  try:
    compiled, _ = sampling.compile_sampler(
      sampler,
      weights,
      mesh,
      global_batch,
      global_batch,
      cond_shape=setup.system.cond_shape(m.get("cond_size", 16)),
    )
  except Exception as e:
    if not compat.is_out_of_memory(e):
      raise
    return {
      "global_batch": global_batch,
      "fits": False,
      "peak_bytes_per_device": compat.required_bytes(e),
      "error": str(e).splitlines()[0][:300],
    }
  mem = dm.memory_of(compiled)
  return {
    "global_batch": global_batch,
    "fits": True,
    "steps": steps,
    "peak_bytes_per_device": mem.get("peak_bytes"),
    "memory": mem,
    "flops_per_call": flops.sample_flops_per_image(m, steps) * global_batch,
    "compile_s": round(time.perf_counter() - t0, 1),
  }


def simulation_flops(num_unknowns: int, rhs: int = 16) -> float:
  """Dense FLOPs of one example's solve: Cholesky n^3/3 plus forward and back substitution for
  the `rhs` injections (2 n^2 each); assembly, phantom and image are O(n) to O(pixels) and left
  out (under 1 % at the default mesh)."""
  n = float(num_unknowns)
  return n**3 / 3 + 2 * 2 * n * n * rhs


def _compile_simulator(cfg, model_system, mesh, step_flops: float) -> dict[str, Any]:
  """The simulator source's batch (`simulator_source.batch_fn`) compiled for `mesh`: its memory
  and its FLOPs beside the train step's."""
  import jax
  import numpy as np

  from cdeit_jax.data import simulator_source, synthetic
  from cdeit_jax.eit import system

  gen = synthetic.generator(cfg.simulator)
  if gen.nominal:  # one solve per example on the condensed fixed system
    unknowns, solves = gen.sim.support_cem(gen.spec.max_radius).num_unknowns, 1
  else:  # a system per example: its own homogeneous voltages too
    passive = system.num_electrodes(gen.system, gen.layout) > gen.layout.num_electrodes
    drawn = gen.sim.drawn_cem(passive, gen.spec.max_radius).drawn(passive)
    unknowns, solves = drawn.num_unknowns, 2
  lay = gen.layout
  r = lay.num_values  # the measuring system's values (208 for CDEIT's)
  zeros, ones = np.zeros(r, np.float32), np.ones(r, np.float32)
  fn = simulator_source.batch_fn(cfg, model_system, mesh, zeros, ones)
  t0 = time.perf_counter()
  step = jax.ShapeDtypeStruct((), np.int32, sharding=shd.replicated(mesh))
  with jax.set_mesh(mesh):
    compiled = fn.lower(step).compile()
  mem = dm.memory_of(compiled)
  sim_flops = simulation_flops(unknowns, lay.num_patterns) * solves * cfg.batch_size
  return {
    "global_batch": cfg.batch_size,
    "unknowns": unknowns,
    "solves": solves,
    "peak_bytes_per_device": mem.get("peak_bytes"),
    "memory": mem,
    "flops_per_step": sim_flops,
    "share_of_step_flops": sim_flops / step_flops,
    "compile_s": round(time.perf_counter() - t0, 1),
  }


def compile_check(
  cfg: ml_collections.ConfigDict, topology: str, workdir: str, print_fn=print, margin: float = 0.85
) -> dict[str, Any]:
  """Compile the train step and the sampler for `topology`; write workdir/compile.json."""
  devices = topology_devices(topology)
  hbm = TOPOLOGIES[topology].hbm_bytes
  n, hosts = len(devices), len({d.process_index for d in devices})
  config_lib.check_training_config(cfg, n, hosts, need_data=False)
  mesh = shd.make_mesh(devices)
  setup = training.setup(cfg, loading.resolve(cfg), mesh, platform="tpu", abstract=True)
  report: dict[str, Any] = {
    "topology": topology,
    "device_kind": devices[0].device_kind,
    "num_devices": n,
    "num_hosts": hosts,
    "global_batch": cfg.batch_size,
    "per_device_batch": cfg.batch_size // n,
    "accum_steps": cfg.accum_steps,
    "dtype": cfg.model.dtype,
    "attention_impl": setup.model_kwargs["attention_impl"],
    "remat": cfg.model.remat,
    "params": setup.num_params,
    "hbm_bytes_per_device": int(hbm),
    "flops_per_step": flops.train_flops_per_example(setup.model_kwargs) * cfg.batch_size,
  }
  t0 = time.perf_counter()
  try:
    compiled = training.compile_train_step(setup, cfg.batch_size, mesh, cfg.shard_params)
    mem = compiled.memory
    report.update(
      fits=mem["peak_bytes"] <= hbm, peak_bytes_per_device=mem["peak_bytes"], memory=mem
    )
  except Exception as e:
    if not compat.is_out_of_memory(e):
      raise
    report.update(
      fits=False, peak_bytes_per_device=compat.required_bytes(e), error=str(e).splitlines()[0][:300]
    )
  report["compile_s"] = round(time.perf_counter() - t0, 1)
  report["within_margin"] = bool(
    report["fits"]
    and report["peak_bytes_per_device"] is not None
    and report["peak_bytes_per_device"] <= margin * hbm
  )
  eval_batch = cfg.eval_batch_size or cfg.batch_size
  report["sampler"] = _compile_sampler(setup, mesh, cfg, eval_batch)
  if config_lib.training_source(cfg).simulates:
    report["simulator"] = _compile_simulator(cfg, setup.system, mesh, report["flops_per_step"])
  if not report["fits"]:
    report["advice"] = memory_fit.fit_advice(cfg, n, "tpu")
  fileio.makedirs(workdir)
  fileio.write_text(fileio.join(workdir, "compile.json"), json.dumps(report, indent=2) + "\n")
  print_fn(format_table([report]))
  if not report["fits"]:
    print_fn(f"does not fit: set {report['advice']}")
  return report


def format_table(reports: list[dict]) -> str:
  gib = lambda b: f"{b / GIB:.2f}" if b else "-"
  head = (
    "config",
    "topology",
    "devices",
    "batch",
    "impl",
    "fits",
    "peak GiB",
    "HBM GiB",
    "used",
    "TFLOP/step",
    "sampler GiB",
    "compile s",
  )
  rows = [head]
  for r in reports:
    s = r.get("sampler", {})
    peak = r.get("peak_bytes_per_device")
    rows.append(
      (
        r.get("config", "-"),
        r["topology"],
        str(r["num_devices"]),
        str(r["global_batch"]),
        r["attention_impl"],
        "yes" if r["fits"] else "NO",
        gib(peak),
        gib(r["hbm_bytes_per_device"]),
        f"{peak / r['hbm_bytes_per_device']:.0%}" if peak else "-",
        f"{r['flops_per_step'] / 1e12:.1f}",
        gib(s.get("peak_bytes_per_device")),
        str(r["compile_s"]),
      )
    )
  widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
  table = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)
  for r in reports:
    if "simulator" in r:
      m = r["simulator"]
      table += (
        f"\nsimulator source: {gib(m['peak_bytes_per_device'])} GiB per device, "
        f"{m['flops_per_step'] / 1e9:.1f} GFLOP per step ({m['unknowns']} unknowns, "
        f"{m['solves']} solve(s) per example), {m['share_of_step_flops']:.3%} of the "
        "train step's FLOPs"
      )
  return table
