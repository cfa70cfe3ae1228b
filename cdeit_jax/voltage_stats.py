"""Normalisation statistics of a training split's voltages: mean.npy and std.npy, into the split's
parent (where the loaders look first) unless --out says otherwise (`cdeit_jax.data.stats`
computes them).

  python -m cdeit_jax.voltage_stats DATA/train [--units U | --voltage_ratio R] [--out DIR]
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common import fileio
from cdeit_jax.data.stats import compute_stats, write_stats
from cdeit_jax.eit import measurement

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  f = FLAGS
  if len(argv) != 2:
    raise app.UsageError("give one split folder: python -m cdeit_jax.voltage_stats DATA/train")
  split = argv[1]
  out = f.out or fileio.dirname(split)
  shipped.refuse_write(out, "--out" if f.out else "the split's parent folder")
  fileio.writable_folder(out, "--out")
  mean, std = compute_stats(
    split, f.units, voltage_ratio=f.voltage_ratio, skip_bad=f.skip_bad_files
  )
  write_stats(out, mean, std)
  print(f"wrote {out}/mean.npy, {out}/std.npy from {split}: std median {np.median(std):.3e}")


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string(
    "units", "simulated", f"the split's units: {', '.join(measurement.unit_names())}"
  )
  flags.DEFINE_float(
    "voltage_ratio", None, "measured / simulated voltage units (overrides the units')"
  )
  flags.DEFINE_string(
    "out",
    None,
    "where to write mean.npy and std.npy (default: the split's "
    "parent, where the loaders look first)",
  )
  flags.DEFINE_boolean(
    "skip_bad_files",
    False,
    "skip unreadable or invalid files with a warning (default: stop and list them)",
  )
  cli.run(main)
