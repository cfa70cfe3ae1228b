"""Times the published PyTorch CDEIT on this CPU (float32): train step (Adam, clip 1) and 5-step
sampling (argv: batch, threads, and "sample" to time the sampler only).
Run with PYTHONPATH=<ref_shim>:<reference checkout>. Prints one JSON line."""

import json
import resource
import sys
import time

import torch
from diffusion import create_diffusion
from models import DiT

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.manual_seed(0)
m, d = DiT(), create_diffusion(timestep_respacing="")
x = torch.randn(B, 1, 128, 128).clamp(-1, 1)
y = torch.randn(B, 1, 16, 16)
t = torch.randint(0, 1000, (B,))
opt = torch.optim.Adam(m.parameters(), lr=1e-5)


def step():
  loss = d.training_losses(m, x, t, dict(y=y, y_st=y))["loss"]
  opt.zero_grad()
  loss.backward()
  torch.nn.utils.clip_grad_norm_(m.parameters(), 1)
  opt.step()


def sample():
  d.ddim_sampleEIT(m, (B, 1, 128, 128), 5, dict(y=y, y_st=y))


ts = [float("nan")]
if sys.argv[3:4] != ["sample"]:
  step()
  ts = []
  for _ in range(2):
    t0 = time.perf_counter()
    step()
    ts.append(time.perf_counter() - t0)
m.eval()
with torch.no_grad():
  sample()
  t0 = time.perf_counter()
  sample()
  ss = time.perf_counter() - t0

print(
  json.dumps(
    {
      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "batch": B,
      "train_step_s": min(ts),
      "train_samples_per_s": B / min(ts),
      "sample_s": ss,
      "sample_images_per_s": B / ss,
    }
  )
)
