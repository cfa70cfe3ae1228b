"""Simulator throughput after compilation; prints JSON.

  python bench/bench_simulate.py [--batch 64 256] [--dtype float32]

Times (1) generation of training examples as `python -m cdeit_jax.simulate` does it (random
phantoms, CEM solve on the condensed system, 40 dB noise, 128 x 128 target; no disk I/O, no TR),
(2) `eit.simulate_voltages` on label images (full system), (3) the Tikhonov matrix (autodiff
Jacobian + 208 x 208 solve). Uses one device (see simulate.Generator on CPU).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax import eit, simulate


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
  a = p.parse_args()
  if a.dtype == "float64":
    jax.config.update("jax_enable_x64", True)
  sim = eit.default_simulator(a.dtype)
  common = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "jax": jax.__version__, "dtype": a.dtype, "mesh_nodes": sim.mesh.num_nodes,
            "mesh_elements": sim.mesh.num_elements}
  spec = eit.PhantomSpec()
  cem = sim.support_cem(spec.max_radius)
  for b in a.batch:
    gen = simulate.Generator(simulate.SimSettings(seed=0), batch_size=b)
    idx = np.arange(b)
    s = timed(lambda: gen("train", idx, with_tr=False)["ys"], a.repeats)
    params = np.stack([eit.random_params(np.random.default_rng(i), spec) for i in idx])
    keys = jax.random.split(jax.random.key(0), b)
    solve = timed(lambda: sim.phantom_voltages(params.astype(sim.dtype), 40.0, keys,
                                               spec.max_radius), a.repeats)
    print(json.dumps({"bench": "generate", **common, "batch": b,
                      "unknowns": cem.num_unknowns, "examples_per_s": round(b / s, 1),
                      "device_examples_per_s": round(b / solve, 1),
                      "ms_per_batch": round(1000 * s, 1)}), flush=True)
    xs = jnp.zeros((b, 128, 128), sim.dtype)
    s = timed(lambda: sim.image_voltages(xs), a.repeats)
    print(json.dumps({"bench": "simulate_voltages", **common, "batch": b,
                      "unknowns": sim.cem.num_unknowns, "images_per_s": round(b / s, 1)}),
          flush=True)
  t = time.perf_counter()
  eit.Tikhonov(sim)
  print(json.dumps({"bench": "tikhonov_matrix", **common,
                    "seconds": round(time.perf_counter() - t, 2)}))


if __name__ == "__main__":
  main()
