"""Time and peak memory of opening a text frames file (`infer.frames.Recording`) of UEF2017's
frames (208 values each) written in shapes people's tools give: LF lines, CR-only line ends
(old Macs, some instruments), all on one comma-separated line, and one number a row; prints
JSON.

  python bench/bench_text_frames.py [--frames 300,100000] [--shapes lf,cr,one,column]
      [--repo DIR] [--timeout 120] [--keep DIR]

Each file is opened in a process of its own (the code of --repo, by default this checkout):
its wall time, peak resident memory (ru_maxrss) and the first 160 characters of its answer
(the frames' shape, or the one-line refusal) are reported; a run past --timeout is reported as
such. The text reader's bar (issue 87): time and memory proportional to the file, whatever its
shape; one line, and a column of one number a row longer than 208 rows, refused after the first
rows.
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
OPEN = (
  "import resource, sys, time; t = time.perf_counter()\n"
  "from cdeit_jax.infer import frames\n"
  "t = time.perf_counter()\n"
  "try:\n"
  "  with frames.Recording(sys.argv[1]) as r: said = f'read: {r.n} frames'\n"
  "except Exception as e: said = f'{type(e).__name__}: {e}'\n"
  "print(time.perf_counter() - t); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
  "print(said)\n"
)


def write(folder: str, n: int, shape: str) -> str:
  """UEF2017's 22 frames repeated to `n` frames, as a .csv of `shape`."""
  ys = np.stack([np.load(f)["ys"].ravel() for f in sorted(glob.glob(f"{REPO}/data/uef2017/*.npz"))])
  rows = [",".join(repr(v) for v in r) for r in ys.tolist()]
  path = os.path.join(folder, f"{shape}_{n}.csv")
  with open(path, "w", newline="") as fh:
    for i in range(n):
      row = rows[i % len(rows)]
      if shape == "lf":
        fh.write(row + "\n")
      elif shape == "cr":
        fh.write(row + "\r")
      elif shape == "one":
        fh.write(("," if i else "") + row)
      else:  # column: one number a row
        fh.write(row.replace(",", "\n") + "\n")
  return path


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--frames", default="300,100000")
  p.add_argument("--shapes", default="lf,cr,one,column")
  p.add_argument("--repo", default=REPO, help="the checkout whose cdeit_jax is timed")
  p.add_argument("--timeout", type=float, default=120.0)
  p.add_argument("--keep", default=None, help="write the files here (and keep them)")
  args = p.parse_args()
  folder = args.keep or tempfile.mkdtemp(prefix="text_frames_")
  os.makedirs(folder, exist_ok=True)
  env = {**os.environ, "PYTHONPATH": os.path.abspath(args.repo), "JAX_PLATFORMS": "cpu"}
  results = []
  for n in (int(x) for x in args.frames.split(",")):
    for shape in args.shapes.split(","):
      path = write(folder, n, shape)
      t0 = time.perf_counter()
      try:
        out = subprocess.run(
          [sys.executable, "-c", OPEN, path],
          capture_output=True,
          text=True,
          timeout=args.timeout,
          env=env,
          cwd=args.repo,
        )
        seconds, rss, said = out.stdout.strip().split("\n", 2)
        row = {"open_s": round(float(seconds), 3), "peak_rss_mb": round(int(rss) / 1024, 1)}
        row["answer"] = said[:160]
      except subprocess.TimeoutExpired:
        row = {"open_s": None, "answer": f"no answer in {args.timeout:g} s"}
      except ValueError:
        row = {"open_s": None, "answer": out.stderr[-300:]}
      row.update(frames=n, shape=shape, file_mb=round(os.path.getsize(path) / 2**20, 1))
      row["process_s"] = round(time.perf_counter() - t0, 2)
      results.append(row)
      print(json.dumps(row), file=sys.stderr, flush=True)
      if not args.keep:
        os.remove(path)
  print(json.dumps({"repo": os.path.abspath(args.repo), "results": results}, indent=1))


if __name__ == "__main__":
  main()
