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

import time

from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  from cdeit_jax.common import logs
  from cdeit_jax.data import ktc2023
  from cdeit_jax.infer import challenge, outputs

  logs.console()
  log = logs.log
  t0 = time.perf_counter()
  cases = ktc2023.read_cases(FLAGS.data_path)  # first: a refused input leaves no empty --out
  outputs.check_out(FLAGS.out, FLAGS.data_path)
  layout = cases[0].layout
  log.info(f"{len(cases)} targets of {layout.describe()}")
  fits = challenge.calibrate(cases)
  for fit in fits.values():
    log.info(f"calibration from the reference frame: {fit.describe()}")
  images = challenge.linear_images(cases, fits, FLAGS.alpha)
  methods = [
    challenge.Method("tikhonov", images, challenge.answers_of(images, FLAGS.segment_level)),
    challenge.water(cases),
  ]
  results = {m.name: challenge.scores(cases, m) for m in methods}
  metrics = {
    "metrics": {k: v for k, v in results.items() if v is not None},
    "settings": {
      "data": "ktc2023_challenge",
      "data_path": FLAGS.data_path,
      "layout": layout.describe(),
      "alpha": FLAGS.alpha,
      "segment_level": FLAGS.segment_level,
      "seconds": time.perf_counter() - t0,
    },
    "calibration": [vars(f) for f in fits.values()],
  }
  challenge.write(FLAGS.out, cases, methods, metrics)
  if all(r is not None for r in results.values()):
    print(challenge.table(cases, results))
  print(f"wrote {len(cases)} answers to {FLAGS.out} in {time.perf_counter() - t0:.1f} s")


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
