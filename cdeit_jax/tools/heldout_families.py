"""Held-out shape families (`cdeit_jax.data.heldout`): simulated test targets of a config's system
whose shapes its phantom generator never draws (letters, blobs, thin bars and arcs, concave
outlines, touching pairs), in two groups: OUT/few (1-4 objects: KTC2023's levels 1-4) and
OUT/many (3-4 objects of both classes: levels 5-7), with OUT/heldout.json listing each file's
family, object count and classes. Score a model on them with

  python -m cdeit_jax.tools.heldout_families --config configs/ktc2023_model.py --out HELD --num 100
  python -m cdeit_jax.tools.answer_study --workdir models/ktc2023 --sims HELD/few --rules argmax
  python -m cdeit_jax.tools.answer_study --workdir models/ktc2023 --sims HELD/many --rules argmax

(levels 1-4 from `few`, 5-7 from `many`). Choose nothing on them: they are a test.
"""

from __future__ import annotations

import functools
import json
import time

from absl import flags

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.data import heldout
  from cdeit_jax.simulate import file_name, savez

  logs.console()
  if FLAGS.num < 1:
    raise InputError(f"--num {FLAGS.num}: give 1 or more targets per group")
  shipped.refuse_write(FLAGS.out, "--out")
  cfg = config_lib.load(FLAGS.config)
  record = {"config": FLAGS.config, "seed": FLAGS.seed, "num": FLAGS.num, "groups": {}}
  for group in heldout.GROUPS:
    t0 = time.perf_counter()
    made = heldout.make(cfg.simulator, group, FLAGS.num, FLAGS.seed)
    folder = fileio.join(FLAGS.out, group)
    fileio.makedirs(folder)
    for i, (ys, xs) in enumerate(zip(made["ys"], made["xs"])):
      arrays = {"ys": ys[:, None], "xs": xs}
      fileio.atomic_write(
        fileio.join(folder, file_name(i)), functools.partial(savez, arrays=arrays)
      )
    record["groups"][group] = {k: made[k] for k in ("families", "objects", "classes")}
    logs.log.info(f"{folder}: {FLAGS.num} targets in {time.perf_counter() - t0:.0f} s")
  fileio.write_text(fileio.join(FLAGS.out, "heldout.json"), json.dumps(record, indent=1))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("config", None, "the config whose system measures them", required=True)
  flags.DEFINE_string("out", None, "the folder to write (few/, many/, heldout.json)", required=True)
  flags.DEFINE_integer("num", 100, "targets per group")
  flags.DEFINE_integer("seed", 0, "their seed")
  cli.run(main)
