"""The Kuopio Tomography Challenge 2023 with the linearised reconstruction: answers and scores.

  python -m cdeit_jax.challenge --data_path data/ktc2023/levels --out runs/ktc2023_linear

DATA_PATH is the challenge's folder of `level_K` folders (or one level folder) with `ref.mat`,
`dataN.mat` and, where known, `trueN.mat`. Writes OUT/level_K/N.mat (`reconstruction`: the
challenge's 256 x 256 answer of 0/1/2; `image`: the continuous image), `answers.png` and
`metrics.json` (`metrics.tikhonov.ktc_score` and `metrics.water.ktc_score`, per level and per
target, and the calibration of each reference frame), and prints the per-level table. The
device is calibrated from `ref.mat` (gain and contact impedance, `cdeit_jax.eit.calibration`);
removed electrodes' values are left out of the reconstruction (docs/ktc2023.md).
"""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  from cdeit_jax.common import logs
  from cdeit_jax.infer import challenge

  logs.console()
  r = challenge.linear_answers(FLAGS.data_path, FLAGS.out, FLAGS.alpha, FLAGS.segment_level)
  if "table" in r:
    print(r["table"])
  print(f"wrote {r['targets']} answers to {FLAGS.out} in {r['settings']['seconds']:.1f} s")


if __name__ == "__main__":
  from cdeit_jax import cli
  from cdeit_jax.eit.tikhonov import DEFAULT_ALPHA
  from cdeit_jax.infer.challenge import SEGMENT_LEVEL

  flags.DEFINE_string("data_path", None, "the challenge's folder of level_K folders", required=True)
  flags.DEFINE_string("out", None, "where the answers and metrics.json go", required=True)
  flags.DEFINE_float("alpha", DEFAULT_ALPHA, "the Tikhonov/NOSER regularisation level")
  flags.DEFINE_float(
    "segment_level", SEGMENT_LEVEL, "the fraction of the image's largest magnitude kept as class"
  )
  cli.define_cache_flag()
  cli.run(main)
