"""The published model's attention calls alone, forward and forward + backward; prints JSON.

  python bench/bench_attention.py [--batch 2 --impl auto --repeats 3]

Each kind of attention the published CDEIT runs (`SHAPES`: global over 4,096, 1,024, 256, 64 and
16 tokens, and the 256-token windows with their relative position bias), timed apart from the rest
of the network with the backend the model uses (`--impl`, resolved as the model resolves it), so
that a train step's time can be split into attention and the rest.
`bench/reference/ref_attention.py` times the same calls in PyTorch (`bench_vs_reference.py` runs
both). FLOPs: the two attention matmuls, 4 B N T S D a forward (B the batch times the windows
per image, N heads, T queries, S keys, D the head size), a backward pass twice the forward's
(recomputation not counted), as `cdeit_jax.model.flops` counts the model.
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
from attention_calls import HEAD_DIM, HEADS, SHAPES, record, totals

from cdeit_jax.common import hardware
from cdeit_jax.model import attention


def best_of(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best


def time_shape(name: str, batch: int, impl: str, repeats: int) -> dict:
  tokens, windows, count = SHAPES[name]
  b = batch * (windows or 1)
  rng = np.random.default_rng(0)
  q, k, v, dout = (
    jnp.asarray(rng.standard_normal((b, tokens, HEADS, HEAD_DIM)), jnp.float32) for _ in range(4)
  )
  bias = None
  if windows:
    bias = jnp.asarray(0.02 * rng.standard_normal((1, HEADS, tokens, tokens)), jnp.float32)
  fwd = jax.jit(lambda q, k, v, bias: attention.attend(q, k, v, bias, impl=impl))

  def fwd_bwd(q, k, v, bias, dout):
    out, vjp = jax.vjp(
      lambda q, k, v, bias: attention.attend(q, k, v, bias, impl=impl), q, k, v, bias
    )
    return vjp(dout)

  fwd_s = best_of(fwd, (q, k, v, bias), repeats)
  train_s = best_of(jax.jit(fwd_bwd), (q, k, v, bias, dout), repeats)
  return record(batch, tokens, windows, count, fwd_s, train_s)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--impl", default="auto", choices=attention.IMPLS)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
  a = p.parse_args()
  impl = attention.resolve(a.impl, jax.default_backend(), jnp.float32)
  shapes = {name: time_shape(name, a.batch, impl, a.repeats) for name in a.shapes.split(",")}
  out = {
    "bench": "attention",
    "backend": jax.default_backend(),
    "impl": impl,
    "batch": a.batch,
    "dtype": "float32",
    "shapes": shapes,
    **totals(shapes),
  }
  if hardware.peak_tflops() is None:
    out["matmul_gflops_f32"] = round(hardware.matmul_gflops(), 1)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
