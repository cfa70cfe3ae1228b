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

from cdeit_jax.common import hardware
from cdeit_jax.model import attention

HEADS, HEAD_DIM = 16, 32  # the published model: hidden 512, 16 heads
# name -> (tokens, windows per image (None: global), how many blocks of the model run it);
# tests/test_attention.py checks these against the calls the published model makes
SHAPES = {
  "global_4096": (4096, None, 2),  # the last Up's two blocks (64 x 64 tokens)
  "global_1024": (1024, None, 4),  # the first Down's and the third Up's (32 x 32)
  "global_256": (256, None, 4),  # the second Down's and the second Up's (16 x 16)
  "global_64": (64, None, 4),  # the third Down's and the first Up's (8 x 8)
  "global_16": (16, None, 3),  # the fourth Down's two blocks and the middle block (4 x 4)
  "window_256": (256, 16, 4),  # swinIn1/2, swinOut1/2: 16 windows of 16 x 16 with a bias
}


def attention_flops(batch: int, tokens: int, windows: int | None) -> float:
  """A forward pass's matmul FLOPs (q k^T and p v) of one call."""
  b = batch * (windows or 1)
  return 4 * b * HEADS * tokens * tokens * HEAD_DIM


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
  f = attention_flops(batch, tokens, windows)
  return {
    "tokens": tokens,
    "windows": windows,
    "blocks_in_model": count,
    "fwd_s": round(fwd_s, 4),
    "fwd_bwd_s": round(train_s, 4),
    "fwd_gflops": round(f / fwd_s / 1e9, 1),
    "fwd_bwd_gflops": round(3 * f / train_s / 1e9, 1),
  }


def totals(shapes: dict) -> dict:
  """What one train step and one forward pass of the published model spend in attention: each
  call's time (`time_shape`'s, or the reference's of the same form) times the blocks that run it."""
  total = lambda key: round(sum(s[key] * s["blocks_in_model"] for s in shapes.values()), 3)
  return {"train_step_attention_s": total("fwd_bwd_s"), "forward_attention_s": total("fwd_s")}


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
