"""Held-out shape families (`cdeit_jax.data.heldout`): simulated test targets of a config's system
whose shapes its phantom generator never draws (letters, blobs, thin bars and arcs, concave
outlines, touching pairs), in two groups: OUT/few (1-4 objects: KTC2023's levels 1-4) and
OUT/many (3-4 objects of both classes: levels 5-7), with OUT/heldout.json listing each file's
family, object count and classes. Score a model on them with

  python -m cdeit_jax.heldout_families --config configs/ktc2023_model.py --out HELD --num 100
  python -m cdeit_jax.answer_study --workdir models/ktc2023 --sims HELD/few --rules argmax
  python -m cdeit_jax.answer_study --workdir models/ktc2023 --sims HELD/many --rules argmax

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
RECORD = "heldout.json"


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.data import heldout
  from cdeit_jax.simulate import file_name, savez

  logs.console()
  if FLAGS.num < 1:
    raise InputError(f"--num {FLAGS.num}: give 1 or more targets per group")
  out = fileio.resolve(FLAGS.out)
  shipped.refuse_write(out, "--out")
  fileio.writable_folder(out, "--out")  # a file there is refused before any simulating
  ours = fileio.path(fileio.join(out, RECORD)).exists()
  if not ours and any(fileio.path(out).iterdir()):
    raise InputError(
      f"--out {FLAGS.out}: holds files and no {RECORD} (not a set of held-out families); give a "
      "new or empty folder"
    )
  cfg = config_lib.load(FLAGS.config)
  record = {"config": FLAGS.config, "seed": FLAGS.seed, "num": FLAGS.num, "groups": {}}
  stage = f"{out}.partial"  # the new set, made whole beside the old one, then put in its place
  fileio.remove_tree(stage)
  for group in heldout.GROUPS:
    t0 = time.perf_counter()
    made = heldout.make(cfg.simulator, group, FLAGS.num, FLAGS.seed)
    folder = fileio.join(stage, group)
    fileio.makedirs(folder)
    for i, (ys, xs) in enumerate(zip(made["ys"], made["xs"])):
      arrays = {"ys": ys[:, None], "xs": xs}
      fileio.atomic_write(
        fileio.join(folder, file_name(i)), functools.partial(savez, arrays=arrays)
      )
    record["groups"][group] = {k: made[k] for k in ("families", "objects", "classes")}
    took = time.perf_counter() - t0
    logs.log.info(f"{fileio.join(out, group)}: {FLAGS.num} targets in {took:.0f} s")
  fileio.write_text(fileio.join(stage, RECORD), json.dumps(record, indent=1))
  # a set made before (another --num or seed) is replaced whole: no target of it stays
  for group in heldout.GROUPS:
    fileio.remove_tree(fileio.join(out, group))
    fileio.move(fileio.join(stage, group), fileio.join(out, group))
  fileio.move(fileio.join(stage, RECORD), fileio.join(out, RECORD))  # the record last
  fileio.remove_tree(stage)


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("config", None, "the config whose system measures them", required=True)
  flags.DEFINE_string("out", None, "the folder to write (few/, many/, heldout.json)", required=True)
  flags.DEFINE_integer("num", 100, "targets per group")
  flags.DEFINE_integer("seed", 0, "their seed")
  cli.run(main)
