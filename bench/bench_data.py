"""Input-pipeline throughput (samples/s per host) on a generated folder of CDEIT npz files.

  python bench/bench_data.py --files 2000 --batch 64 --workers 0 2 --batches 60
Prints one JSON line per setting (workers x cache), after a warm-up of a few batches.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.data import pipeline, sources
from cdeit_jax.eit.layout import preset


def make_folder(root: str, n: int) -> str:
  split = os.path.join(root, "train")
  os.makedirs(split, exist_ok=True)
  rng = np.random.default_rng(0)
  for i in range(n):
    np.savez(
      os.path.join(split, f"{i:06d}.npz"),
      ys=rng.normal(0, 1e-5, (208, 1)).astype(np.float32),
      xs=rng.uniform(-1, 1, (128, 128)).astype(np.float32),
      TR=rng.uniform(-1, 1, (128, 128)).astype(np.float32),
    )
  np.save(os.path.join(root, "mean.npy"), np.zeros((1, 16, 13), np.float32))
  np.save(os.path.join(root, "std.npy"), np.full((1, 16, 13), 1e-5, np.float32))
  return split


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--files", type=int, default=2000)
  p.add_argument("--batch", type=int, default=64, help="per-host batch")
  p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
  p.add_argument("--threads", type=int, default=4)
  p.add_argument("--batches", type=int, default=60, help="timed batches per setting")
  p.add_argument("--dir", default=None, help="reuse/generate the folder here")
  a = p.parse_args()
  root = a.dir or tempfile.mkdtemp(prefix="cdeit_bench_")
  split = os.path.join(root, "train")
  if not os.path.isdir(split) or len(os.listdir(split)) < a.files:
    t = time.perf_counter()
    make_folder(root, a.files)
    print(
      json.dumps({"bench": "generate", "files": a.files, "s": round(time.perf_counter() - t, 2)})
    )
  for cache in (False, True):
    t = time.perf_counter()
    src = sources.NpzSource(split, cache=cache)
    open_s = time.perf_counter() - t
    for workers in a.workers:
      opts = config_lib.default_config().data
      opts.update(num_workers=workers, num_threads=a.threads)
      it = iter(pipeline.train_dataset(src, a.batch, opts, preset("cdeit16")))
      for _ in range(5):  # warm-up: start workers, fill prefetch
        next(it)
      t = time.perf_counter()
      for _ in range(a.batches):
        next(it)
      dt = time.perf_counter() - t
      print(
        json.dumps(
          {
            "bench": "pipeline",
            "files": len(src),
            "cache": cache,
            "workers": workers,
            "threads": a.threads,
            "batch": a.batch,
            "open_and_validate_s": round(open_s, 2),
            "samples_per_s": round(a.batches * a.batch / dt, 1),
            "batches_per_s": round(a.batches / dt, 2),
            "cpus": os.cpu_count(),
          }
        ),
        flush=True,
      )


if __name__ == "__main__":
  main()
