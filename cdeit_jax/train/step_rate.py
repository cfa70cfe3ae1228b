"""The train step's throughput on all local devices, after compilation: the figures
`bench/bench_train.py` prints and the accelerator check's `train` section records
(`python -m cdeit_jax.accelerator_check`)."""

from __future__ import annotations

import time

import jax
import numpy as np

from cdeit_jax.checkpoints import loading
from cdeit_jax.common import device_memory, hardware
from cdeit_jax.common import sharding as shd
from cdeit_jax.train import training


def measure(
  cfg, per_device_batch: int, accum_steps: int = 1, steps: int = 3, sync_each_step: bool = False
) -> dict:
  """The train step of `cfg` on all local devices: compiled, one warm-up step, then `steps`
  timed steps on one random batch; samples/s, TFLOP/s per device, the fraction of the peak or
  of this machine's matmul rate, memory."""
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
    "fused_attention": device_memory.fused_attention(c.fn),
    "peak_rss_bytes": peak_rss(),
    "loss": float(m["loss"]),
    "device_peak_bytes": device_stat("peak_bytes_in_use"),
    "device_bytes_limit": device_stat("bytes_limit"),
  }


def device_stat(key: str) -> int | None:
  """The first device's memory statistic `key` (`peak_bytes_in_use` so far, `bytes_limit`: what
  this process's allocator may hold); None where JAX has no figure (a CPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get(key)


def peak_rss() -> int:
  """This process's peak resident memory (host memory: what CPU runs need)."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
