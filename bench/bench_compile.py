"""Compile-only memory and FLOP table of the shipped configs on TPU topologies; prints JSON lines.

  python bench/bench_compile.py    # the shipped configs on v5e-8, v5p-8, v6e-8
  python bench/bench_compile.py --configs configs/v5e8.py --topologies v5e-8 v5e-16

Needs libtpu (pip install -e '.[tpu]'), not a TPU: each pair is compiled as
`train.py --config C --compile_topology T` does (`cdeit_jax.train.aot`); one JSON line per pair (its
compile.json), then the table.
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
  print(aot.format_table(reports), file=sys.stderr)


if __name__ == "__main__":
  main()
