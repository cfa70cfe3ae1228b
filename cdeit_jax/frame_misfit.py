"""Whether the KTC2023 frames can tell their truths from the answers (`cdeit_jax.infer.
frame_misfit`): per public target, the calibrated simulator's misfit to its frame for the truth,
each answer folder's answer and worse answers made from the truth, as JSON and a table per level.

  python -m cdeit_jax.frame_misfit --data data/ktc2023/levels --answers cdeit=OUT \
      [--answers tikhonov=OUT2] [--levels 1,4,7] [--turns_deg=-5.625,0,5.625] [--out misfit.json]

OUT: eval.py's ktc2023_challenge output (`level_K/N.mat`). `--turns_deg` adds the truth turned
counter-clockwise by each angle: where the frames put the electrodes against the answers' grid.
"""

from __future__ import annotations

import json

from absl import flags

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError

FLAGS = flags.FLAGS
WHAT = "a frame misfit's JSON (python -m cdeit_jax.frame_misfit)"


def ours(path: str) -> bool:
  """Whether `path` is a misfit JSON this command wrote (its cases, levels and settings)."""
  return fileio.json_holds(path, ("cases", "levels", "settings"))


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.infer import frame_misfit

  answers = dict(a.split("=", 1) if "=" in a else (a, a) for a in FLAGS.answers or [])
  if any(not name or not path for name, path in answers.items()):
    raise InputError("--answers NAME=FOLDER: give a name and eval.py's ktc2023_challenge output")
  if FLAGS.out:
    shipped.refuse_write(FLAGS.out, "--out")
    inputs = [("--data", FLAGS.data), *((f"--answers {n}", p) for n, p in answers.items())]
    fileio.refuse_own_input(FLAGS.out, "--out", inputs, writes=())
    fileio.output_file(FLAGS.out, "--out", ours, WHAT)  # a misfit JSON is replaced, no other
  result = frame_misfit.run(
    FLAGS.data,
    answers,
    tuple(int(k) for k in FLAGS.levels),
    FLAGS.variants,
    tuple(float(d) for d in FLAGS.turns_deg),
  )
  if FLAGS.out:
    fileio.write_text(FLAGS.out, json.dumps(result, indent=1), ours=ours, what=WHAT)
  print(frame_misfit.table(result["levels"]))


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("data", None, "folder of level_K folders with truths (data/ktc2023/levels)")
  flags.DEFINE_multi_string("answers", None, "NAME=FOLDER: eval.py's ktc2023_challenge output")
  flags.DEFINE_list("levels", [], "levels to measure (default: all)")
  flags.DEFINE_bool("variants", True, "also the worse answers made from each truth")
  flags.DEFINE_list("turns_deg", [], "also the truth turned by these angles (degrees, ccw)")
  flags.DEFINE_string("out", None, "write the whole result as JSON here")
  flags.mark_flag_as_required("data")
  cli.run(main)
