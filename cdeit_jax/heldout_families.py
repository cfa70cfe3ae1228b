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

from absl import flags

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  write_families(FLAGS.out, FLAGS.config, FLAGS.num, FLAGS.seed)


def write_families(out_flag: str, config: str, num: int, seed: int) -> None:
  """Both groups of `num` targets (module docstring) of `config`'s system into `out_flag`, after
  the checks of the output folder (never a shipped model's; new, empty or a set made before)."""
  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.data import heldout

  logs.console()
  if num < 1:
    raise InputError(f"--num {num}: give 1 or more targets per group")
  out = fileio.resolve(out_flag)
  shipped.refuse_write(out, "--out")
  fileio.writable_folder(out, "--out")  # a file there is refused before any simulating
  ours = fileio.path(fileio.join(out, heldout.RECORD)).exists()
  if not ours and any(fileio.path(out).iterdir()):
    raise InputError(
      f"--out {out_flag}: holds files and no {heldout.RECORD} (not a set of held-out families); "
      "give a new or empty folder"
    )
  heldout.write_set(out, config_lib.load(config).simulator, num, seed, config)


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("config", None, "the config whose system measures them", required=True)
  flags.DEFINE_string("out", None, "the folder to write (few/, many/, heldout.json)", required=True)
  flags.DEFINE_integer("num", 100, "targets per group")
  flags.DEFINE_integer("seed", 0, "their seed")
  cli.run(main)
