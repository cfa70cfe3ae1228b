"""Simulator throughput after compilation; prints JSON.

  python bench/bench_simulate.py [--batch 64 256] [--dtype float32]
  python bench/bench_simulate.py --source --config configs/demo.py [--batch 16]
  python bench/bench_simulate.py --layout ktc2023 [--batch 64 256]

`--source`: the simulator data source (`config.data.source="simulator"`) on every device:
examples/s of its batches (global and per device) against the train step's consumption
(samples/s of `config`'s step at the same global batch), and the simulation's share of a step
that makes its batch first (both timed after compilation, each waited for).

Times (1) generation of training examples as `python -m cdeit_jax.simulate` does it (random
phantoms, 40 dB noise, 128 x 128 target; no disk I/O, no TR), measured by the one nominal system
(the condensed fast path) and by a system drawn per example (`config.simulator.system`: the
boundary stays in the solve and each example solves its homogeneous voltages too), (2)
`eit.simulate_voltages` on label images (full system), (3) the Tikhonov matrix (adjoint
Jacobian + 208 x 208 solve). Uses one device (see synthetic.per_example on CPU).

`--layout NAME`: another measuring system (`cdeit_jax.eit.layout` preset, e.g. KTC2023's 32
electrodes and 2,356 values): random phantoms' noisy difference values per second on a mesh made
for its electrodes, and the seconds its Jacobian takes (all rows; bench/bench_jacobian.py
measures it alone, with its memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax import eit
from cdeit_jax.eit import layout as eit_layout


def timed(fn, repeats):
  jax.block_until_ready(fn())  # compile + warm-up
  t = time.perf_counter()
  for _ in range(repeats):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - t) / repeats


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
  p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--source", action="store_true", help="bench the on-device data source")
  p.add_argument("--config", default=None, help="--source: the config whose step consumes")
  p.add_argument("--layout", default=None, help="a measuring-system preset (eit.layout)")
  a = p.parse_args()
  if a.source:
    return bench_source(a)
  if a.layout:
    return bench_layout(a)
  if a.dtype == "float64":
    jax.config.update("jax_enable_x64", True)
  sim = eit.default_simulator(eit_layout.preset("cdeit16"), a.dtype)
  common = {
    "device": jax.devices()[0].device_kind,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "dtype": a.dtype,
    "mesh_nodes": sim.mesh.num_nodes,
    "mesh_elements": sim.mesh.num_elements,
  }
  from cdeit_jax import config_lib
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.data import synthetic
  from cdeit_jax.eit.spec import SystemSpec

  mesh = shd.make_mesh(jax.devices()[:1])
  nominal = config_lib.default_config().simulator
  nominal.system.update(dataclasses.asdict(SystemSpec.nominal()))
  for b in a.batch:
    for name, settings in (
      ("nominal", nominal),
      ("per_example", config_lib.default_config().simulator),
    ):
      gen = synthetic.generator(settings)
      idx = np.arange(b)
      s = timed(lambda: synthetic.example_arrays(settings, "train", idx, mesh), a.repeats)
      cem = (
        sim.support_cem(gen.spec.max_radius)
        if gen.nominal
        else sim.drawn_cem(True, gen.spec.max_radius).drawn(True)
      )
      print(
        json.dumps(
          {
            "bench": "generate",
            **common,
            "system": name,
            "batch": b,
            "unknowns": cem.num_unknowns,
            "examples_per_s": round(b / s, 1),
            "ms_per_example": round(1000 * s / b, 2),
          }
        ),
        flush=True,
      )
    xs = jnp.zeros((b, 128, 128), sim.dtype)
    s = timed(lambda: sim.image_voltages(xs), a.repeats)
    print(
      json.dumps(
        {
          "bench": "simulate_voltages",
          **common,
          "batch": b,
          "unknowns": sim.cem.num_unknowns,
          "images_per_s": round(b / s, 1),
        }
      ),
      flush=True,
    )
  t = time.perf_counter()
  eit.Tikhonov(eit.jacobian(sim))
  print(
    json.dumps({"bench": "tikhonov_matrix", **common, "seconds": round(time.perf_counter() - t, 2)})
  )


def bench_layout(a) -> None:
  from cdeit_jax.eit import layout, phantom, simulator, tikhonov

  lay = layout.preset(a.layout)
  sim = simulator.Simulator(layout=lay, dtype=a.dtype)
  common = {
    "device": jax.devices()[0].device_kind,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "dtype": a.dtype,
    "layout": lay.describe(),
    "mesh_nodes": sim.mesh.num_nodes,
    "mesh_elements": sim.mesh.num_elements,
  }
  rng = np.random.default_rng(0)
  for b in a.batch:
    params = jnp.asarray(np.stack([phantom.random_params(rng) for _ in range(b)]), sim.dtype)
    keys = jax.random.split(jax.random.key(0), b)
    s = timed(lambda: sim.phantom_voltages(params, 40.0, keys), a.repeats)
    out = {"bench": "layout_generate", **common, "batch": b, "values": lay.num_values}
    print(json.dumps({**out, "examples_per_s": round(b / s, 1)}), flush=True)
  t = time.perf_counter()
  tikhonov.jacobian(sim)
  print(
    json.dumps({"bench": "layout_jacobian", **common, "seconds": round(time.perf_counter() - t, 2)})
  )


def bench_source(a) -> None:
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.data import simulator_source, synthetic
  from cdeit_jax.data.sources import ArraySource
  from cdeit_jax.eit import measurement
  from cdeit_jax.train import training

  cfg = config_lib.load(a.config) if a.config else config_lib.default_config()
  mesh = shd.make_mesh()
  n = mesh.size
  ys, xs = synthetic.example_arrays(cfg.simulator, "train", np.arange(64), mesh)
  values = synthetic.generator(cfg.simulator).layout.num_values  # the simulated device's
  running = measurement.RunningStats(num_values=values)
  running.add(ys)
  mean, std = running.result()
  for b in a.batch:
    g = -(-b // n) * n
    cfg.batch_size = g
    system = loading.resolve(cfg)
    make = simulator_source.batch_fn(cfg, system, mesh, mean, std)
    step0 = jax.device_put(jnp.int32(0), shd.replicated(mesh))
    sim_s = timed(lambda: make(step0), a.repeats)
    calibration = ArraySource(ys, xs, mean, std, name="bench", vector_cond=system.reads_values)
    ts = training.setup(cfg, system, mesh, calibration_source=calibration)
    c = training.compile_train_step(ts, g, mesh)
    state = jax.device_put(ts.state, c.state_shardings)
    constants = jax.device_put(ts.constants, c.constants_shardings)
    batch = make(step0)
    key = jax.random.key(0)
    box = [state]

    def step():
      box[0], m = c.fn(box[0], batch, key, constants)
      return m

    step_s = timed(step, a.repeats)
    print(
      json.dumps(
        {
          "bench": "simulator_source",
          "device": jax.devices()[0].device_kind,
          "backend": jax.default_backend(),
          "devices": n,
          "jax": jax.__version__,
          "config": a.config or "default",
          "global_batch": g,
          "per_example_solves": synthetic.per_example(jax.default_backend()),
          "sim_examples_per_s": round(g / sim_s, 1),
          "sim_examples_per_s_per_device": round(g / sim_s / n, 1),
          "step_samples_per_s": round(g / step_s, 1),
          "sim_ms": round(1000 * sim_s, 1),
          "step_ms": round(1000 * step_s, 1),
          "sim_over_consumption": round(step_s / sim_s, 2),
          "sim_share_of_step_time": round(sim_s / (sim_s + step_s), 3),
        }
      ),
      flush=True,
    )


if __name__ == "__main__":
  main()
