"""KTC2023's answer rules scored for a model per level, on held-out simulations and the public
cases, and the rule chosen (`cdeit_jax.infer.answer_study` does the study).

  python -m cdeit_jax.answer_study --workdir runs/ktc2023_model \\
      --sims DATA/valid[,DATA_DRIFT/valid] --num 256 --ktc data/ktc2023/levels --out study.json
"""

from __future__ import annotations

import json

from absl import flags

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer.answer_rules import AnswerRule
from cdeit_jax.infer.answer_study import study, tables
from cdeit_jax.infer.refinement import Refinement

FLAGS = flags.FLAGS
WHAT = "an answer study's JSON (python -m cdeit_jax.answer_study)"


def ours(path: str) -> bool:
  """Whether `path` is a study's JSON this command wrote (its metrics and settings)."""
  return fileio.json_holds(path, ("metrics", "settings"))


def main(argv: list[str]) -> None:
  del argv
  logs.console()
  if not (FLAGS.sims or FLAGS.ktc):
    raise InputError("give --sims, --ktc or both: the targets to score the rules on")
  rules = [AnswerRule.parse(r, "--rules") for r in FLAGS.rules.split(",")] if FLAGS.rules else None
  if FLAGS.out:
    shipped.refuse_write(FLAGS.out, "--out")
    sims = [("--sims", s) for s in (FLAGS.sims or "").split(",") if s]
    inputs = [*sims, ("--ktc", FLAGS.ktc)]  # the workdir may hold it (not its checkpoints/)
    fileio.refuse_own_input(FLAGS.out, "--out", inputs, writes=())
    fileio.output_file(FLAGS.out, "--out", ours, WHAT)  # a study's JSON is replaced, no other
  refinements = [Refinement.parse(f, "--refinements") for f in FLAGS.refinements]
  refinements = [f for f in refinements if f is not None]  # "" or none: no refinement
  result = study(
    FLAGS.workdir, FLAGS.sims, FLAGS.num, FLAGS.ktc, rules, FLAGS.samples, None, refinements
  )
  print(tables(result))
  if FLAGS.out:
    fileio.write_text(FLAGS.out, json.dumps(result, indent=1), ours=ours, what=WHAT)


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("workdir", None, "a KTC2023 model (a run or a model folder)", required=True)
  flags.DEFINE_string(
    "sims", None, "simulated splits of the model's system, comma-separated (e.g. DATA/valid)"
  )
  flags.DEFINE_integer("num", 256, "simulated targets per level from each split")
  flags.DEFINE_string("ktc", None, "the challenge's levels folder (data/ktc2023/levels)")
  flags.DEFINE_integer("samples", 8, "samples per target")
  flags.DEFINE_string("rules", None, "comma-separated rules instead of the default candidates")
  flags.DEFINE_multi_string(
    "refinements",
    [],
    "a refinement of the first rule's answers against their frames, scored beside "
    "(objects:tau=...:move=..., repeatable; cdeit_jax.infer.refinement)",
  )
  flags.DEFINE_string("out", None, "write the JSON here")
  cli.run(main)
