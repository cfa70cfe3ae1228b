"""Times the published PyTorch CDEIT: train step (Adam, clip 1) and 5-step sampling; one JSON line.

Run with PYTHONPATH=<ref_shim>:<reference checkout>:
  python ref_bench.py --batch 2 --threads 2                     # CPU, float32
  python ref_bench.py --batch 32 --device cuda --dtype bfloat16  # a GPU, bfloat16 autocast
  python ref_bench.py --batch 2 --sample-only                    # the sampler alone
`--patch/--hidden`: the model's sizes (default: the published 2 and 512; the reference's U-net
always has 4 scales and 16 heads a block, whatever DiT's `num_heads`). bfloat16 is PyTorch's
usual mixed precision, `torch.autocast` (float32 weights, bfloat16 matrix products), as ours
keeps float32 parameters. On CUDA each timing is bracketed by `torch.cuda.synchronize()`.
"""

import argparse
import json
import resource
import time

import torch
from diffusion import create_diffusion
from models import DiT

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=2)
p.add_argument("--threads", type=int, default=2, help="CPU threads (CPU only)")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
p.add_argument("--patch", type=int, default=2)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--steps", type=int, default=2, help="timed train steps")
p.add_argument("--sample-only", action="store_true")
a = p.parse_args()

torch.set_num_threads(a.threads)
dev = torch.device(a.device)
B = a.batch
torch.manual_seed(0)
m = DiT(patch_size=a.patch, hidden_size=a.hidden).to(dev)
d = create_diffusion(timestep_respacing="")
x = torch.randn(B, 1, 128, 128, device=dev).clamp(-1, 1)
y = torch.randn(B, 1, 16, 16, device=dev)
t = torch.randint(0, 1000, (B,), device=dev)
opt = torch.optim.Adam(m.parameters(), lr=1e-5)
autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")


def sync():
  if a.device == "cuda":
    torch.cuda.synchronize()


def step():
  with autocast:
    loss = d.training_losses(m, x, t, dict(y=y, y_st=y))["loss"]
  opt.zero_grad()
  loss.backward()
  torch.nn.utils.clip_grad_norm_(m.parameters(), 1)
  opt.step()


def sample():
  with autocast:
    d.ddim_sampleEIT(m, (B, 1, 128, 128), 5, dict(y=y, y_st=y))


def timed(fn) -> float:
  sync()
  t0 = time.perf_counter()
  fn()
  sync()
  return time.perf_counter() - t0


ts = [float("nan")]
if not a.sample_only:
  timed(step)  # warm-up (CUDA: kernels chosen, memory pooled)
  ts = [timed(step) for _ in range(a.steps)]
m.eval()
with torch.no_grad():
  timed(sample)
  ss = timed(sample)

out = {
  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
  "batch": B,
  "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
  "torch": torch.__version__,
  "dtype": a.dtype,
  "params": sum(q.numel() for q in m.parameters()),
  "train_step_s": min(ts),
  "train_samples_per_s": B / min(ts),
  "sample_s": ss,
  "sample_images_per_s": B / ss,
}
if a.device == "cuda":
  out["device_peak_bytes"] = torch.cuda.max_memory_allocated()
print(json.dumps(out))
