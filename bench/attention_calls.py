"""The published model's attention calls, as both sides' attention benchmarks time them
(`bench_attention.py`, ours; `reference/ref_attention.py`, PyTorch's): the table of calls, their
FLOPs, one call's JSON record and a step's totals. Plain Python: the PyTorch side imports it too."""

from __future__ import annotations

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


def record(batch: int, tokens: int, windows, count: int, fwd_s: float, fwd_bwd_s: float) -> dict:
  """One call's timings as JSON: seconds and GFLOP/s (a backward pass twice the forward's)."""
  f = attention_flops(batch, tokens, windows)
  return {
    "tokens": tokens,
    "windows": windows,
    "blocks_in_model": count,
    "fwd_s": round(fwd_s, 4),
    "fwd_bwd_s": round(fwd_bwd_s, 4),
    "fwd_gflops": round(f / fwd_s / 1e9, 1),
    "fwd_bwd_gflops": round(3 * f / fwd_bwd_s / 1e9, 1),
  }


def totals(shapes: dict) -> dict:
  """What one train step and one forward pass of the published model spend in attention: each
  call's time times the blocks that run it."""
  total = lambda key: round(sum(s[key] * s["blocks_in_model"] for s in shapes.values()), 3)
  return {"train_step_attention_s": total("fwd_bwd_s"), "forward_attention_s": total("fwd_s")}
