"""Times the published PyTorch CDEIT's attention calls alone on this CPU (float32), as
`bench/bench_attention.py` times ours: global attention as the model runs it (timm's Attention,
`F.scaled_dot_product_attention`, as bench/reference/ref_shim stands in for it) and the windows
as its `WindowAttention` computes them (q k^T + relative position bias, softmax, @ v). Also
torch's float32 2,048^3 matmul rate.
argv: batch, threads, and the calls as JSON {name: [tokens, windows per image or null, blocks of
the model]} (`bench_vs_reference.py` passes bench_attention.py's). Prints one JSON line."""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attention_calls import HEAD_DIM, HEADS, record  # noqa: E402  (bench/)

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 2


def best_of(fn, repeats=3):
  fn()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def window_attention(q, k, v, bias):  # models.py WindowAttention.forward, mask None
  attn = (q * HEAD_DIM**-0.5) @ k.transpose(-2, -1)
  attn = attn + bias.unsqueeze(0)
  return torch.softmax(attn, dim=-1) @ v


def time_shape(tokens, windows, count):
  b = B * (windows or 1)
  g = torch.Generator().manual_seed(0)
  q, k, v, dout = (torch.randn(b, HEADS, tokens, HEAD_DIM, generator=g) for _ in range(4))
  bias = 0.02 * torch.randn(HEADS, tokens, tokens, generator=g) if windows else None
  attend = (
    (lambda q, k, v: window_attention(q, k, v, bias)) if windows else F.scaled_dot_product_attention
  )
  with torch.no_grad():
    fwd_s = best_of(lambda: attend(q, k, v))
  for x in (q, k, v) + ((bias,) if windows else ()):
    x.requires_grad_()

  def fwd_bwd():
    for x in (q, k, v) + ((bias,) if windows else ()):
      x.grad = None  # as a train step's zero_grad: no accumulation into earlier gradients
    attend(q, k, v).backward(dout)

  train_s = best_of(fwd_bwd)
  return record(B, tokens, windows, count, fwd_s, train_s)


a = torch.randn(2048, 2048)
matmul = 2 * 2048**3 / best_of(lambda: a @ a, 5) / 1e9
shapes = {name: time_shape(*s) for name, s in json.loads(sys.argv[3]).items()}
print(
  json.dumps(
    {
      "batch": B,
      "shapes": shapes,
      "matmul_gflops_f32": round(matmul, 1),
    }
  )
)
