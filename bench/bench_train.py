"""Train-step throughput of CDEIT on all local devices, after compilation; prints JSON.

  python bench/bench_train.py                                   # published size, float32
  python bench/bench_train.py --config configs/v5e8.py --per-device-batch 8
Reports samples/s, achieved TFLOP/s per device (model FLOPs from XLA's cost analysis of the
compiled step) and the fraction of the device's bf16 peak where known.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from cdeit_jax import config_lib, hardware, training
from cdeit_jax import sharding as shd
from cdeit_jax.diffusion import Diffusion
from cdeit_jax.model import CDEIT, count_params


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=None, help="config file (default: the published recipe)")
  p.add_argument("--per-device-batch", type=int, default=2)
  p.add_argument("--accum-steps", type=int, default=1)
  p.add_argument("--dtype", default=None, choices=sorted(config_lib.DTYPES))
  p.add_argument("--hidden-size", type=int, default=None)
  p.add_argument("--remat", action="store_true")
  p.add_argument("--attention-impl", default=None, choices=["xla", "cudnn"])
  p.add_argument("--attention-query-chunk", type=int, default=None)
  p.add_argument("--steps", type=int, default=3, help="timed steps")
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
  n = jax.device_count()
  global_batch = a.per_device_batch * n * a.accum_steps
  mesh = shd.make_mesh()
  model = CDEIT(**config_lib.model_kwargs(cfg), rngs=nnx.Rngs(0))
  params = count_params(model)
  tx, schedule = training.make_optimizer(cfg)
  graphdef, state = training.create_state(model, tx)
  del model
  fn = training.make_train_step(graphdef, Diffusion(), tx, schedule,
                                training.StepConfig(accum_steps=a.accum_steps), mesh)
  c = training.compile_train_step(fn, jax.eval_shape(lambda: state), global_batch,
                                  cfg.model.to_dict(), mesh, cfg.shard_params)
  state = jax.device_put(state, c.state_shardings)
  rng = np.random.default_rng(0)
  size = cfg.model.image_size
  batch = {"cond": rng.standard_normal((global_batch, 16, 16, 1), np.float32),
           "target": rng.uniform(-1, 1, (global_batch, size, size, 1)).astype(np.float32)}
  batch = {k: jax.device_put(v, shd.batch_sharded(mesh)) for k, v in batch.items()}
  key = jax.random.key(0)
  state, m = c.fn(state, batch, key)  # warm-up
  jax.block_until_ready(m)
  t = time.perf_counter()
  for _ in range(a.steps):
    state, m = c.fn(state, batch, key)
  jax.block_until_ready(m)
  step_s = (time.perf_counter() - t) / a.steps
  peak = hardware.peak_tflops()
  tflops = c.flops_per_step / step_s / 1e12 if c.flops_per_step else None
  print(json.dumps({
      "bench": "train_step", "device": jax.devices()[0].device_kind, "devices": n,
      "backend": jax.default_backend(), "jax": jax.__version__, "params": params,
      "dtype": cfg.model.dtype, "remat": cfg.model.remat,
      "attention_query_chunk": cfg.model.attention_query_chunk, "per_device_batch": a.per_device_batch,
      "accum_steps": a.accum_steps, "global_batch": global_batch,
      "compile_s": round(c.compile_s, 1), "step_s": round(step_s, 4),
      "samples_per_s": round(global_batch / step_s, 3),
      "samples_per_s_per_device": round(global_batch / step_s / n, 3),
      "flops_per_step_per_device": c.flops_per_step, "tflops_per_device": tflops,
      "peak_tflops": peak, "fraction_of_peak": tflops / peak if (tflops and peak) else None,
      "memory_per_device": c.memory, "loss": float(m["loss"])}))


if __name__ == "__main__":
  main()
