"""Compile-only memory and FLOP table of the shipped configs on TPU and GPU topologies; prints
JSON lines.

  python bench/bench_compile.py    # the shipped configs on v5e-8, v5p-8, v6e-8
  python bench/bench_compile.py --configs configs/v5e8.py --topologies v5e-8 v5e-16
  python bench/bench_compile.py --configs configs/gpu.py --topologies h100-1 h200-1 --largest-batch

Needs libtpu (pip install -e '.[tpu]') for TPUs, JAX's CUDA plugin (pip install -e '.[cuda-aot]')
for GPUs, no accelerator: each pair is compiled as `train.py --config C --compile_topology T`
does (`cdeit_jax.train.aot`); one JSON line per pair (its compile.json), then the table.
`--largest-batch` adds, per pair, the largest per-device batch whose train step fits, each
candidate compiled (`aot.largest_batch`: 3-6 compiles), as a `largest_batch` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from cdeit_jax import config_lib  # noqa: E402
from cdeit_jax.train import aot  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  root = os.path.dirname(HERE)
  shipped = ("v5e8", "v5e8_physics", "v5e8_simulator", "gpu", "default")
  p.add_argument(
    "--configs", nargs="+", default=[os.path.join(root, "configs", f"{c}.py") for c in shipped]
  )
  p.add_argument("--topologies", nargs="+", default=["v5e-8", "v5p-8", "v6e-8"])
  p.add_argument("--largest-batch", action="store_true", help="also the largest batch that fits")
  a = p.parse_args()
  reports = []
  for path in a.configs:
    for topology in a.topologies:
      cfg = config_lib.load(path)
      with tempfile.TemporaryDirectory() as d:
        r = aot.compile_check(cfg, topology, d, print_fn=lambda *x: None)
      r["config"] = os.path.relpath(path, root)
      print(json.dumps(r), flush=True)
      reports.append(r)
      if a.largest_batch:
        say = lambda *x: print(*x, file=sys.stderr, flush=True)
        b = aot.largest_batch(config_lib.load(path), topology, print_fn=say, report=r)
        print(json.dumps({"bench": "largest_batch", "config": r["config"], **b}), flush=True)
  print(aot.format_table(reports), file=sys.stderr)


if __name__ == "__main__":
  main()
