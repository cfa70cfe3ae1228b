"""Ahead-of-time compile checks for TPU and GPU topologies, on any machine (no accelerator).

`python train.py --config CONFIG --compile_topology v5e-8 --workdir DIR` (or `h100-8`, `h200-1`)
builds the run's exact train step (same mesh, shardings, donation; the model only as shapes) and
the sampler that `eval.py` uses over compile-only devices of the topology (as MaxText's
train_compile.py does; `common.topologies`), then writes DIR/compile.json and prints a table.
TPUs need libtpu (`pip install -e ".[tpu]"`), GPUs JAX's CUDA plugin (`pip install -e
".[cuda-aot]"`). The FLOPs are the analytic count (`model.flops`); the fused attention calls are
counted in the compiled HLO. A GPU compile without a GPU autotunes nothing and builds no cuDNN
graphs: it says what fits and what is compiled, not how fast it runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import ml_collections
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import compat, fileio, libtpu_env, topologies
from cdeit_jax.common import device_memory as dm
from cdeit_jax.common import sharding as shd
from cdeit_jax.eit import measurement
from cdeit_jax.infer import sampling
from cdeit_jax.model import flops
from cdeit_jax.train import memory_fit, training

GIB = dm.GIB


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
    "fused_attention": dm.fused_attention(compiled),
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


def compile_step(
  setup: training.Setup, global_batch: int, mesh, hbm: int, shard_params: bool = False
) -> dict[str, Any]:
  """The train step of `setup` at `global_batch` compiled for `mesh`: fits `hbm` per device, peak
  bytes per device, the memory breakdown, the fused attention it holds, compile seconds (a
  program the compiler refuses for memory: fits false with the figure it needed)."""
  t0 = time.perf_counter()
  try:
    compiled = training.compile_train_step(setup, global_batch, mesh, shard_params)
  except Exception as e:
    if not compat.is_out_of_memory(e):
      raise
    return {
      "fits": False,
      "peak_bytes_per_device": compat.required_bytes(e),
      "error": str(e).splitlines()[0][:300],
      "compile_s": round(time.perf_counter() - t0, 1),
    }
  mem = compiled.memory
  return {
    "fits": mem["peak_bytes"] <= hbm,
    "peak_bytes_per_device": mem["peak_bytes"],
    "memory": mem,
    "fused_attention": dm.fused_attention(compiled.fn),
    "compile_s": round(time.perf_counter() - t0, 1),
  }


def _setup(cfg: ml_collections.ConfigDict, topology: str):
  """(target, mesh, setup) of `cfg` on the compile-only devices of `topology`."""
  target = topologies.target(topology)
  n, hosts = len(target.devices), len({d.process_index for d in target.devices})
  config_lib.check_training_config(cfg, n, hosts, need_data=False)
  mesh = shd.make_mesh(target.devices)
  # the platform is the devices' own: what a run on them resolves (attention "auto" included)
  return target, mesh, training.setup(cfg, loading.resolve(cfg), mesh, abstract=True)


def largest_batch(
  cfg: ml_collections.ConfigDict,
  topology: str,
  print_fn=print,
  most: int = 4096,
  report: dict | None = None,
) -> dict[str, Any]:
  """The largest per-device batch (at `cfg.accum_steps`) whose train step fits `topology`'s
  devices, each candidate compiled (`memory_fit.largest_fitting`'s search from the config's
  batch; `report`: its `compile_check` of the config, not compiled again). {"per_device_batch",
  "peak_bytes", "compiles": [[per-device batch, fits, peak bytes], ...]}."""
  target, mesh, setup = _setup(cfg, topology)
  n, k = len(target.devices), cfg.accum_steps

  def measure(b: int) -> tuple[bool, int | None]:
    r = compile_step(setup, b * n * k, mesh, target.hbm_bytes, cfg.shard_params)
    peak = r["peak_bytes_per_device"]
    print_fn(f"{topology}: per-device batch {b}: peak {peak} bytes, fits {r['fits']}")
    return r["fits"], peak

  start = max(cfg.batch_size // (n * k), 1)
  known = {}
  if report and report["topology"] == topology and report["global_batch"] == start * n * k:
    known[start] = (report["fits"], report["peak_bytes_per_device"])
  best, tried = memory_fit.largest_fitting(measure, start, target.hbm_bytes, most, known)
  return {
    "topology": topology,
    "per_device_batch": best,
    "at_ceiling": best >= most,  # the search's ceiling fits: the largest is more
    "global_batch": best * n * k,
    "peak_bytes": tried[best][1] if best else None,
    "hbm_bytes_per_device": target.hbm_bytes,
    "compiles": [[b, ok, peak] for b, (ok, peak) in sorted(tried.items())],
  }


def compile_check(
  cfg: ml_collections.ConfigDict,
  topology: str,
  workdir: str,
  print_fn=print,
  margin: float = 0.85,
  sampler: bool = True,
) -> dict[str, Any]:
  """Compile the train step and (`sampler`) the sampler for `topology`; write
  workdir/compile.json."""
  target, mesh, setup = _setup(cfg, topology)
  devices, hbm = target.devices, target.hbm_bytes
  n, hosts = len(devices), len({d.process_index for d in devices})
  print_fn(opening_line(target, hosts))
  print_fn(f"compiling the train step (global batch {cfg.batch_size}, {cfg.model.dtype}) ...")
  report: dict[str, Any] = {
    "topology": topology,
    "platform": target.platform,
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
    "hbm_source": target.hbm_source,
    "device_memory_bytes": int(target.device_memory_bytes),
    # analytic, every loop iteration counted (a compile-only GPU client's cost_analysis() is None)
    "flops_per_step": flops.train_flops_per_example(setup.model_kwargs) * cfg.batch_size,
    **compile_step(setup, cfg.batch_size, mesh, hbm, cfg.shard_params),
  }
  done = "refused by the compiler (memory)" if "error" in report else "compiled"
  print_fn(f"train step {done} in {report['compile_s']} s")
  report["within_margin"] = bool(
    report["fits"]
    and report["peak_bytes_per_device"] is not None
    and report["peak_bytes_per_device"] <= margin * hbm
  )
  if sampler:
    batch = cfg.eval_batch_size or cfg.batch_size
    print_fn(f"compiling eval.py's sampler (batch {batch}) ...")
    report["sampler"] = _compile_sampler(setup, mesh, cfg, batch)
    print_fn(f"sampler compiled in {report['sampler'].get('compile_s', '-')} s")
  if config_lib.training_source(cfg).simulates:
    print_fn(f"compiling the simulator source's batch ({cfg.batch_size} examples) ...")
    report["simulator"] = _compile_simulator(cfg, setup.system, mesh, report["flops_per_step"])
    print_fn(f"simulator source compiled in {report['simulator']['compile_s']} s")
  if not report["fits"]:
    report["advice"] = memory_fit.fit_advice(cfg, n, target.platform)
  fileio.makedirs(workdir)
  fileio.write_text(fileio.join(workdir, "compile.json"), json.dumps(report, indent=2) + "\n")
  print_fn(format_table([report]))
  if not report["fits"]:
    print_fn(f"does not fit: set {report['advice']}")
  return report


def opening_line(target: topologies.Target, hosts: int) -> str:
  """The check's first line: what it compiles for, and that nothing runs (no accelerator needed;
  a published-size config takes minutes on a few CPU cores: docs/training.md)."""
  devices = f"{len(target.devices)} {target.devices[0].device_kind} devices"
  if hosts > 1:
    devices += f" on {hosts} hosts"
  if target.platform == "tpu":
    here = "this machine has no TPU: " if not libtpu_env.tpu_chips_present() else ""
    how = "libtpu compiles for them"
  else:
    here, how = "", "XLA's GPU compiler compiles for them (no GPU needed)"
  return (
    f"{here}compile-only check for {target.name} ({devices}); {how}, nothing runs; the "
    "published size takes minutes on a CPU (each program's seconds follow)"
  )


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
    "attn calls",
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
        str(r.get("fused_attention", {}).get("calls", "-")),
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
