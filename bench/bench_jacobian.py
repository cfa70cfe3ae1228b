"""A measuring system's Jacobian (`eit.tikhonov.jacobian`, the adjoint method on the host in
float64): seconds and peak resident memory per preset; prints JSON.

  python bench/bench_jacobian.py [--layout cdeit16 ktc2023] [--autodiff]

Each preset runs in a fresh process (its peak memory is its own) and is timed twice: the first
call builds the mesh and the forward model's operators, the second only solves. `--autodiff`
also times reverse-mode autodiff through the CEM (the method it replaced: `jax.jacrev` of the
simulator, rows in chunks of 208) for comparison; for KTC2023's 2,356 rows it takes minutes.
The machine's float64 matmul rate is printed beside, as the solves' yardstick.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _one(name: str, autodiff: bool) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from cdeit_jax.eit import layout, simulator, tikhonov

  lay = layout.preset(name)
  sim = simulator.Simulator(lay)
  base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  times = []
  for _ in range(2):
    t = time.perf_counter()
    jac = tikhonov.jacobian(sim)
    times.append(time.perf_counter() - t)
  out = {
    "bench": "jacobian",
    "layout": lay.describe(),
    "rows": int(jac.shape[0]),
    "mesh_nodes": sim.mesh.num_nodes,
    "mesh_elements": sim.mesh.num_elements,
    "first_s": round(times[0], 2),
    "seconds": round(times[1], 2),
    "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    "peak_rss_added_gb": round(
      (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 2**20, 2
    ),
  }
  a = np.random.default_rng(0).standard_normal((2048, 2048))
  a @ a
  t = time.perf_counter()
  for _ in range(3):
    a @ a
  out["float64_matmul_gflops"] = round(3 * 2 * 2048**3 / (time.perf_counter() - t) / 1e9, 1)
  if autodiff:
    fn = lambda x: sim.difference(sim.image_conductivity(x))
    x0 = jnp.zeros((128, 128), sim.dtype)
    rows = jac.shape[0]
    pull = jax.jit(lambda x, cts: jax.vmap(jax.vjp(fn, x)[1])(cts)[0])
    t = time.perf_counter()
    auto = np.zeros_like(jac)
    for lo in range(0, rows, 208):
      n = min(208, rows - lo)
      cts = np.zeros((208, rows), np.float32)
      cts[np.arange(n), lo + np.arange(n)] = 1.0
      auto[lo : lo + n] = np.asarray(pull(x0, cts))[:n]
    out["autodiff_seconds"] = round(time.perf_counter() - t, 2)
    out["max_relative_difference"] = float(np.abs(auto - jac).max() / np.abs(jac).max())
  return out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--layout", nargs="+", default=["cdeit16", "ktc2023"])
  p.add_argument("--autodiff", action="store_true")
  p.add_argument("--one", help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.one:
    print(json.dumps(_one(a.one, a.autodiff)), flush=True)
    return
  for name in a.layout:
    cmd = [sys.executable, __file__, "--one", name] + (["--autodiff"] if a.autodiff else [])
    subprocess.run(cmd, check=True)


if __name__ == "__main__":
  main()
