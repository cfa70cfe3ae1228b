"""Frame reconstruction speed through the public API (`cdeit_jax.Reconstructor`); prints JSON.

  python bench/bench_reconstruct.py --workdir runs/demo [--reference REF_CHECKOUT]

For single frames and batches of 8 and 64, at K = 1 and K = 8 samples per frame: frames/s and
the p50/p99 latency of one `reconstruct` call (conditioning, padding to the bucket, the compiled
sampler, the gather and the mean/std: what a user's acquisition loop waits for), after
compilation; beside it the compiled sampler alone (where the time goes: host or device), its
FLOPs counted from the sampler's jaxpr (every step of the loop) and the fraction of this
machine's own float32 matmul rate (XLA, 2048^3, timed in the same run). Then the published
model's sampler (images/s) beside the PyTorch reference on the same machine in the same run
(`bench/reference/ref_bench.py`, with --reference: a checkout of shuaikaishi/CDEIT, torch
installed). The frames: the moving demo's sequence (`cdeit_jax.sequence`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from cdeit_jax.common import cpu_tuning  # noqa: E402

if __name__ == "__main__":
  cpu_tuning.apply()  # as the commands run (may re-execute this command once)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cdeit_jax.common import hardware  # noqa: E402


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def sampler_flops(rec) -> float:
  """Matmul FLOPs of one row (one image) of the Reconstructor's sampler, every step counted."""
  from cdeit_jax.model import flops

  cond = jax.ShapeDtypeStruct((1, *rec.sampler.cond_shape), jnp.float32)
  idx = jax.ShapeDtypeStruct((1,), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with jax.set_mesh(rec.mesh):
    jaxpr = jax.make_jaxpr(rec.sampler.fn)(rec.sampler.weights, cond, idx, idx, key)
  return flops.jaxpr_matmul_flops(jaxpr)


def bench_api(
  rec, dv: np.ndarray, batch: int, k: int, seconds: float, roof: float, row_flops: float
) -> dict:
  rows = batch * k
  rec.sampler.prepare(rows)
  n = len(dv)
  rec.reconstruct(dv[:batch], num_samples=k)  # warm-up
  lat, at = [], 0
  t_end = time.perf_counter() + seconds
  while time.perf_counter() < t_end or len(lat) < 5:
    lo = at % (n - batch + 1)
    lat.append(_timed(lambda: rec.reconstruct(dv[lo : lo + batch], num_samples=k, first_index=lo)))
    at += batch
  lat = np.asarray(lat)
  # the compiled sampler alone on the same calls (the rows cut into calls of at most max_batch,
  # each padded to its bucket): device time plus the transfers
  sizes = [min(rec.sampler.max_batch, rows - lo) for lo in range(0, rows, rec.sampler.max_batch)]
  key = jax.random.key(0)
  alone_by_bucket = {}
  for bucket in {rec.sampler.executable(r)[0] for r in sizes}:
    run = rec.sampler.executable(bucket)[1]
    cond = jnp.asarray(np.repeat(rec.condition(dv[:1]), bucket, 0))
    idx = jnp.arange(bucket, dtype=jnp.int32)
    run(rec.sampler.weights, cond, idx, idx, key).block_until_ready()
    alone_by_bucket[bucket] = float(
      np.median(
        [
          _timed(lambda: run(rec.sampler.weights, cond, idx, idx, key).block_until_ready())
          for _ in range(max(5, min(len(lat), 30)))
        ]
      )
    )
  buckets = [rec.sampler.executable(r)[0] for r in sizes]
  alone = sum(alone_by_bucket[b] for b in buckets)
  gflops = row_flops * sum(buckets) / alone / 1e9
  return {
    "frames": batch,
    "num_samples": k,
    "rows": rows,
    "sampler_calls": len(buckets),
    "padded_rows": sum(buckets),
    "timed_calls": len(lat),
    "frames_per_s": round(batch / float(np.median(lat)), 2),
    "images_per_s": round(rows / float(np.median(lat)), 2),
    "latency_ms_p50": round(1000 * float(np.median(lat)), 2),
    "latency_ms_p99": round(1000 * float(np.percentile(lat, 99)), 2),
    "sampler_only_ms": round(1000 * alone, 2),
    "host_share": round(1 - alone / float(np.median(lat)), 3),
    "sampler_gflops": round(gflops, 1),
    "fraction_of_matmul_rate": round(gflops / roof, 3),
  }


def bench_published(batch: int, repeats: int) -> dict:
  """The published model (random weights, float32) through the same API at `batch` frames."""
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import loading
  from cdeit_jax.data import stats
  from cdeit_jax.infer.reconstructor import Reconstructor

  cfg = config_lib.default_config()
  model = loading.build(cfg, loading.resolve(cfg))
  mean, std = stats.authors_stats()
  rec = Reconstructor(model, cfg, mean, std, num_examples=batch)
  dv = np.random.default_rng(0).standard_normal((batch, 208)).astype(np.float32) * std.ravel()
  rec.sampler.prepare(batch)
  rec.reconstruct(dv)
  times = [_timed(lambda: rec.reconstruct(dv)) for _ in range(repeats)]
  return {
    "batch": batch,
    "images_per_s": round(batch / float(np.median(times)), 4),
    "s_per_call": round(float(np.median(times)), 2),
    "attention_impl": model.attention_impl,
  }


def bench_reference(reference: str, batch: int, threads: int) -> dict:
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([os.path.join(HERE, "reference", "ref_shim"), reference]),
  )
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(HERE, "reference", "ref_bench.py"),
      "--batch",
      str(batch),
      "--threads",
      str(threads),
      "--sample-only",
    ],
    env=cpu_tuning.tuned_environment(env),
    capture_output=True,
    text=True,
  )
  if r.returncode:
    return {"error": r.stderr.strip().splitlines()[-1][:300] if r.stderr.strip() else "failed"}
  out = json.loads(r.stdout.strip().splitlines()[-1])
  return {
    "batch": batch,
    "threads": threads,
    "images_per_s": round(out["sample_images_per_s"], 4),
    "s_per_call": round(out["sample_s"], 2),
  }


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workdir", default="runs/demo", help="the demo model (make demo)")
  p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per case")
  p.add_argument("--reference", default=None, help="checkout of the published CDEIT code")
  p.add_argument("--published-batch", type=int, default=2)
  p.add_argument("--skip-published", action="store_true")
  a = p.parse_args()

  from cdeit_jax import sequence
  from cdeit_jax.infer.reconstructor import Reconstructor

  roof = hardware.matmul_gflops()
  seq = sequence.simulate(90)
  dv = (seq["frames"] - seq["reference"]).astype(np.float32)
  rec = Reconstructor.from_workdir(a.workdir)
  row_flops = sampler_flops(rec)
  cases = [bench_api(rec, dv, b, k, a.seconds, roof, row_flops) for k in (1, 8) for b in (1, 8, 64)]
  out = {
    "bench": "reconstruct",
    "device": jax.devices()[0].device_kind,
    "backend": jax.default_backend(),
    "devices": jax.device_count(),
    "jax": jax.__version__,
    "cores": len(os.sched_getaffinity(0)),
    "matmul_gflops_f32": round(roof, 1),
    "model": rec.checkpoint,
    "sampling_steps": rec.steps,
    "buckets": rec.sampler.buckets,
    "sampler_gflop_per_image": round(row_flops / 1e9, 4),
    "cases": cases,
  }
  if not a.skip_published:
    out["published"] = bench_published(a.published_batch, 2)
    if a.reference:
      out["published_pytorch"] = bench_reference(
        a.reference, a.published_batch, len(os.sched_getaffinity(0))
      )
      if "images_per_s" in out["published_pytorch"]:
        out["published_speedup"] = round(
          out["published"]["images_per_s"] / out["published_pytorch"]["images_per_s"], 3
        )
  print(json.dumps(out))


if __name__ == "__main__":
  main()
