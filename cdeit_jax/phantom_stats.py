"""A config's drawn phantoms beside real truths: counts, areas and distances to the wall, as JSON
(`cdeit_jax.data.phantom_stats` measures them).

  python -m cdeit_jax.phantom_stats --config configs/ktc2023_model.py \\
      --truths data/ktc2023/levels/level_1 [--num 2000]
"""

from __future__ import annotations

import json

from absl import flags

from cdeit_jax.data.phantom_stats import compare, drawn_maps, summary, truth_maps

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax import config_lib
  from cdeit_jax.data import synthetic

  cfg = config_lib.load(FLAGS.config)
  spec = synthetic.phantom_spec(cfg.simulator)
  drawn = summary(drawn_maps(spec, FLAGS.num, FLAGS.seed))
  truths = summary(truth_maps(FLAGS.truths))
  print(json.dumps({"config": FLAGS.config, "num": FLAGS.num, **compare(drawn, truths)}, indent=1))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("config", None, "a config whose simulator draws the phantoms", required=True)
  flags.DEFINE_string("truths", None, "a folder of trueN.mat (0/1/2 class maps)", required=True)
  flags.DEFINE_integer("num", 2000, "phantoms drawn")
  flags.DEFINE_integer("seed", 0, "their seed")
  cli.run(main)
