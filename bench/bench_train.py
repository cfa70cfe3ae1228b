"""Train-step throughput of CDEIT on all local devices, after compilation; prints JSON.

  python bench/bench_train.py                                   # published size, float32
  python bench/bench_train.py --config configs/v5e8.py --per-device-batch 8
Reports samples/s, achieved TFLOP/s per device (model FLOPs counted analytically with every loop
iteration, `cdeit_jax.model.flops`) and the fraction of the device's bf16 peak where known; on a
CPU, the fraction of the machine's own float32 matmul rate timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import time

from cdeit_jax.common import cpu_tuning

if __name__ == "__main__":
  cpu_tuning.apply()  # as train.py and eval.py run (may re-execute this command once)

import jax  # noqa: E402
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import hardware
from cdeit_jax.common import sharding as shd
from cdeit_jax.model import attention
from cdeit_jax.train import training


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=None, help="config file (default: the published recipe)")
  p.add_argument("--per-device-batch", type=int, default=2)
  p.add_argument("--accum-steps", type=int, default=1)
  p.add_argument("--dtype", default=None, choices=sorted(config_lib.DTYPES))
  p.add_argument("--hidden-size", type=int, default=None)
  p.add_argument("--remat", action="store_true")
  p.add_argument("--attention-impl", default=None, choices=attention.IMPLS)
  p.add_argument("--attention-query-chunk", type=int, default=None)
  p.add_argument("--steps", type=int, default=3, help="timed steps")
  p.add_argument(
    "--sync-each-step",
    action="store_true",
    help="wait for each step and also report the fastest (step_s_min)",
  )
  a = p.parse_args()

  cfg = config_lib.load(a.config) if a.config else config_lib.default_config()
  if a.dtype:
    cfg.model.dtype = a.dtype
  if a.hidden_size:
    cfg.model.hidden_size = a.hidden_size
  if a.remat:
    cfg.model.remat = True
  if a.attention_impl:
    cfg.model.attention_impl = a.attention_impl
  if a.attention_query_chunk:
    cfg.model.attention_query_chunk = a.attention_query_chunk
  print(json.dumps(measure(cfg, a.per_device_batch, a.accum_steps, a.steps, a.sync_each_step)))


def measure(
  cfg, per_device_batch: int, accum_steps: int = 1, steps: int = 3, sync_each_step: bool = False
) -> dict:
  """The train step of `cfg` on all local devices: compiled, one warm-up step, then `steps`
  timed steps on one random batch; the figures this benchmark prints."""
  n = jax.device_count()
  global_batch = per_device_batch * n * accum_steps
  cfg.batch_size, cfg.accum_steps = global_batch, accum_steps
  mesh = shd.make_mesh()
  ts = training.setup(cfg, loading.resolve(cfg), mesh)
  params, state = ts.num_params, ts.state
  c = training.compile_train_step(ts, global_batch, mesh, cfg.shard_params)
  state = jax.device_put(state, c.state_shardings)
  constants = jax.device_put(ts.constants, c.constants_shardings)
  rng = np.random.default_rng(0)
  size = cfg.model.image_size
  batch = {  # the condition's shape is the model's: an EIM grid, or a frame's values
    "cond": rng.standard_normal(
      (global_batch, *ts.system.cond_shape(cfg.model.cond_size)), np.float32
    ),
    "target": rng.uniform(-1, 1, (global_batch, size, size, 1)).astype(np.float32),
  }
  batch = {k: jax.device_put(v, shd.batch_sharded(mesh)) for k, v in batch.items()}
  key = jax.random.key(0)
  state, m = c.fn(state, batch, key, constants)  # warm-up
  jax.block_until_ready(m)
  if sync_each_step:  # per-step times (min, as bench/reference/ref_bench.py reports)
    times = []
    for _ in range(steps):
      t = time.perf_counter()
      state, m = c.fn(state, batch, key, constants)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t)
    step_s, step_s_min = float(np.mean(times)), float(np.min(times))
  else:
    t = time.perf_counter()
    for _ in range(steps):
      state, m = c.fn(state, batch, key, constants)
    jax.block_until_ready(m)
    step_s = step_s_min = (time.perf_counter() - t) / steps
  peak = hardware.peak_tflops()
  # no vendor peak (a CPU): this machine's own float32 matmul rate, timed now, is the roof; an
  # accelerator's bfloat16 rate (8,192^3) is timed beside its vendor's peak
  roof = None if peak else hardware.matmul_gflops()
  bf16_rate = hardware.matmul_gflops(8192, 3, jax.numpy.bfloat16) / 1e3 if peak else None
  # model FLOPs with every loop iteration counted (cdeit_jax.model.flops)
  tflops = c.flops_per_step / n / step_s / 1e12
  return {
    "bench": "train_step",
    "device": jax.devices()[0].device_kind,
    "devices": n,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "params": params,
    "dtype": cfg.model.dtype,
    "remat": cfg.model.remat,
    "attention_impl": ts.model_kwargs["attention_impl"],
    "attention_query_chunk": cfg.model.attention_query_chunk,
    "per_device_batch": per_device_batch,
    "accum_steps": accum_steps,
    "global_batch": global_batch,
    "compile_s": round(c.compile_s, 1),
    "step_s": round(step_s, 4),
    "step_s_min": round(step_s_min, 4),
    "samples_per_s_best": round(global_batch / step_s_min, 3),
    "samples_per_s": round(global_batch / step_s, 3),
    "samples_per_s_per_device": round(global_batch / step_s / n, 3),
    "flops_per_step_per_device": c.flops_per_step / n,
    "tflops_per_device": tflops,
    "peak_tflops": peak,
    "fraction_of_peak": tflops / peak if (tflops and peak) else None,
    "matmul_tflops_bf16": round(bf16_rate, 1) if bf16_rate else None,
    "matmul_gflops_f32": round(roof, 1) if roof else None,
    "fraction_of_matmul_rate": round(tflops * 1e3 / roof, 3) if roof else None,
    "memory_per_device": c.memory,
    "peak_rss_bytes": peak_rss(),
    "loss": float(m["loss"]),
    "device_peak_bytes": device_peak_bytes(),
  }


def device_peak_bytes() -> int | None:
  """The first device's peak memory in use so far (accelerators; None where JAX has no figure,
  a CPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def peak_rss() -> int:
  """This process's peak resident memory (host memory: what CPU runs need)."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
  main()
