"""Forward (and sampler) throughput of the CDEIT network after compilation; prints JSON.

python bench/bench_model.py                      # published size, batch 2, float32
python bench/bench_model.py --dtype bfloat16 --batch 32 --sample
"""

from __future__ import annotations

import argparse
import json
import time

from cdeit_jax.common import cpu_tuning

if __name__ == "__main__":
  cpu_tuning.apply()  # as train.py and eval.py run (may re-execute this command once)

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.common import hardware
from cdeit_jax.model import attention, flops
from cdeit_jax.model.diffusion import Diffusion
from cdeit_jax.model.network import CDEIT, count_params


def timed(fn, *args, repeats):
  fn(*args).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--dtype", default="float32", choices=sorted(config_lib.DTYPES))
  p.add_argument("--hidden-size", type=int, default=512)
  p.add_argument("--attention-impl", default=None, choices=attention.IMPLS)
  p.add_argument("--attention-query-chunk", type=int, default=None)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--sample", action="store_true", help="also time the 5-step sampler")
  p.add_argument(
    "--config", default=None, help="a config file's model (dtype and sizes; not the flags above)"
  )
  a = p.parse_args()

  cfg = config_lib.load(a.config) if a.config else config_lib.default_config()
  system = loading.resolve(cfg)
  if a.config:
    kw = config_lib.model_kwargs(cfg, system)
    a.dtype = jnp.dtype(kw["dtype"]).name
  else:
    kw = dict(
      system=system,
      hidden_size=a.hidden_size,
      dtype=config_lib.DTYPES[a.dtype],
      attention_impl=a.attention_impl,
      attention_query_chunk=a.attention_query_chunk,
    )
  model = CDEIT(**kw, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((a.batch, 128, 128, 1)), jnp.float32)
  t = jnp.asarray(rng.integers(0, 1000, a.batch), jnp.int32)
  cond = jnp.asarray(
    rng.standard_normal((a.batch, *system.cond_shape(kw.get("cond_size", 16)))), jnp.float32
  )

  fwd = jax.jit(lambda s, x, t, c: nnx.merge(graphdef, s)(x, t, c))
  t0 = time.perf_counter()
  compiled = fwd.lower(state, x, t, cond).compile()
  compile_s = time.perf_counter() - t0
  step_s = timed(compiled, state, x, t, cond, repeats=a.repeats)
  fwd_flops = a.batch * flops.forward_flops(**kw)
  peak = hardware.peak_tflops()
  tflops = fwd_flops / step_s / 1e12
  out = {
    "bench": "forward",
    "device": jax.devices()[0].device_kind,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "params": count_params(model),
    "batch": a.batch,
    "dtype": a.dtype,
    "attention_impl": model.attention_impl,
    "attention_query_chunk": kw.get("attention_query_chunk"),
    "compile_s": round(compile_s, 2),
    "forward_s": round(step_s, 4),
    "images_per_s": round(a.batch / step_s, 3),
    "flops_per_forward": fwd_flops,
    "achieved_tflops": tflops,
    "peak_tflops": peak,
    "fraction_of_peak": (tflops / peak) if (tflops and peak) else None,
  }
  if a.sample:
    d = Diffusion()
    key = jax.random.key(0)
    t0 = time.perf_counter()
    d.sample(model, cond, key=key).block_until_ready()
    out["sampler_first_call_s"] = round(time.perf_counter() - t0, 2)
    s = timed(lambda c: d.sample(model, c, key=key), cond, repeats=a.repeats)
    out.update(
      sampler_s=round(s, 4),
      sampler_images_per_s=round(a.batch / s, 3),
      sampler_ms_per_image=round(1000 * s / a.batch, 2),
      sampler_tflops=5 * fwd_flops / s / 1e12,
    )
  import resource

  out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print(json.dumps(out))


if __name__ == "__main__":
  main()
