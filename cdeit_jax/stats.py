"""Normalisation statistics of a training split: `mean.npy`, `std.npy` of shape (1, 16, 13), per
measurement, the std with N - 1 as the authors computed it (`cdeit_jax.data.stats`).

  python -m cdeit_jax.stats DATA/train [--preset uef2017 | --voltage_ratio R] [--out DIR]

They go to the split's parent (where the loaders look first) unless --out says otherwise.
"""

import numpy as np
from absl import app, flags

from cdeit_jax import cli
from cdeit_jax.common import fileio
from cdeit_jax.data import stats
from cdeit_jax.eit import measurement

flags.DEFINE_string("preset", "simulated", f"the split's units: {', '.join(measurement.PRESETS)}")
flags.DEFINE_float(
  "voltage_ratio", None, "measured / simulated voltage units (overrides the preset's)"
)
flags.DEFINE_string(
  "out",
  None,
  "where to write mean.npy and std.npy (default: the split's parent, where the loaders look first)",
)
flags.DEFINE_boolean(
  "skip_bad_files",
  False,
  "skip unreadable or invalid files with a warning (default: stop and list them)",
)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("give one split folder: python -m cdeit_jax.stats DATA/train")
  split = argv[1]
  out = FLAGS.out or fileio.dirname(split)
  fileio.writable_folder(out, "--out")
  mean, std = stats.compute_stats(
    split, FLAGS.preset, voltage_ratio=FLAGS.voltage_ratio, skip_bad=FLAGS.skip_bad_files
  )
  stats.write_stats(out, mean, std)
  print(f"wrote {out}/mean.npy, {out}/std.npy from {split}: std median {np.median(std):.3e}")


if __name__ == "__main__":
  cli.run(main)
