"""Peak memory of `python -m cdeit_jax.reconstruct` against the length of the recording; prints
JSON.

  python bench/bench_reconstruct_memory.py [--workdir RUN] [--frames 500,8000] \
      [--format npy|mat|csv] [--out DIR] [-- --config.sampling.num_samples=1 ...]

The frames: UEF2017's 22 difference frames repeated with 1 % noise (device units, preset
uef2017), as an .npy file, a MATLAB v7.3 .mat (frames as columns, as EIDORS keeps them) or a
.csv. The model: RUN, or the test config's tiny model trained first into a temporary folder.
Each length runs in its own process (flags after `--` are reconstruct's); its peak resident
memory (ru_maxrss), wall time and outputs are reported, with the streaming bar of issue 33 (the
longest recording's peak at most 1.25 times the shortest's, plus 100 MB) and issue 56's (at
most 2.5 GB for 33,000 frames). --out DIR keeps the outputs there (they take about 260 kB a
frame: frames.npz in float32, frames.mat in float64).
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


def frames_file(folder: str, n: int, kind: str = "npy") -> str:
  ys = np.stack([np.load(f)["ys"].ravel() for f in sorted(glob.glob(f"{REPO}/data/uef2017/*.npz"))])
  rng = np.random.default_rng(0)
  rows = ys[np.arange(n) % len(ys)]
  rows = rows + 0.01 * rows.std() * rng.standard_normal(rows.shape)
  path = os.path.join(folder, f"frames_{n}.{kind}")
  if kind == "npy":
    np.save(path, rows)
  elif kind == "mat":
    import hdf5storage

    hdf5storage.savemat(path, {"frames": rows.T.copy()}, format="7.3")
  else:
    np.savetxt(path, rows, delimiter=",")
  return path


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default=None)
  p.add_argument("--frames", default="500,8000")
  p.add_argument("--format", default="npy", choices=("npy", "mat", "csv"))
  p.add_argument("--out", default=None, help="keep the outputs in this folder")
  p.add_argument("settings", nargs="*", help="reconstruct's own flags (after --)")
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
      f = frames_file(d, n, a.format)
      out = os.path.join(a.out or d, f"out_{n}")
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
          out,
          "--units",
          "uef2017",
          *a.settings,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
      )
      if r.returncode:
        sys.exit(r.stderr[-3000:])
      with np.load(os.path.join(out, "frames.npz"), mmap_mode="r") as z:
        images = z["images"].shape
      results.append(
        {
          "frames": n,
          "format": a.format,
          "images": list(images),
          "peak_rss_mb": round(int(r.stdout.split()[-1]) / 2**20, 1),
          "seconds": round(time.perf_counter() - t0, 1),
          "reconstruct_says": r.stdout.strip().splitlines()[-2] if r.stdout else "",
          "outputs_mb": {
            os.path.basename(x): round(os.path.getsize(x) / 2**20, 1)
            for x in sorted(glob.glob(os.path.join(out, "*")))
          },
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
        "within_2_5_gb_per_33000": all(
          r["peak_rss_mb"] * 2**20 <= 2.5e9 for r in results if r["frames"] <= 33000
        ),
        "workdir": a.workdir or "configs/test.py (trained here)",
        "settings": a.settings,
      }
    )
  )


if __name__ == "__main__":
  main()
