"""Peak memory of `python -m cdeit_jax.reconstruct` against the length of the recording; prints
JSON.

  python bench/bench_reconstruct_memory.py [--workdir RUN] [--frames 500,8000]

The frames: UEF2017's 22 difference frames repeated with 1 % noise (device units, preset
uef2017), as an .npy file. The model: RUN, or the test config's tiny model trained first into a
temporary folder. Each length runs in its own process; its peak resident memory (ru_maxrss) and
wall time are reported, with the streaming bar of issue 33: the longest recording's peak at most
1.25 times the shortest's, plus 100 MB.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEAK = (
  "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
  "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(r.returncode)"
)


def frames_file(folder: str, n: int) -> str:
  ys = np.stack([np.load(f)["ys"].ravel() for f in sorted(glob.glob(f"{REPO}/data/uef2017/*.npz"))])
  rng = np.random.default_rng(0)
  rows = ys[np.arange(n) % len(ys)]
  rows = rows + 0.01 * rows.std() * rng.standard_normal(rows.shape)
  path = os.path.join(folder, f"frames_{n}.npy")
  np.save(path, rows)
  return path


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default=None)
  p.add_argument("--frames", default="500,8000")
  a = p.parse_args()
  env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  with tempfile.TemporaryDirectory() as d:
    workdir = a.workdir
    if workdir is None:
      workdir = os.path.join(d, "run")
      subprocess.run(
        [sys.executable, "train.py", "--config", "configs/test.py", "--workdir", workdir],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
      )
    results = []
    for n in (int(x) for x in a.frames.split(",")):
      f = frames_file(d, n)
      t0 = time.perf_counter()
      r = subprocess.run(
        [
          sys.executable,
          "-c",
          PEAK,
          sys.executable,
          "-m",
          "cdeit_jax.reconstruct",
          "--workdir",
          workdir,
          "--frames",
          f,
          "--out",
          os.path.join(d, f"out_{n}"),
          "--preset",
          "uef2017",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
      )
      if r.returncode:
        sys.exit(r.stderr[-3000:])
      results.append(
        {
          "frames": n,
          "peak_rss_mb": round(int(r.stdout.split()[-1]) / 2**20, 1),
          "seconds": round(time.perf_counter() - t0, 1),
          "outputs_mb": round(
            sum(os.path.getsize(x) for x in glob.glob(os.path.join(d, f"out_{n}", "*"))) / 2**20, 1
          ),
        }
      )
  first, last = results[0], results[-1]
  print(
    json.dumps(
      {
        "bench": "reconstruct_memory",
        "runs": results,
        "peak_ratio": round(last["peak_rss_mb"] / first["peak_rss_mb"], 3),
        "within_bar": last["peak_rss_mb"] <= 1.25 * first["peak_rss_mb"] + 100,
      }
    )
  )


if __name__ == "__main__":
  main()
