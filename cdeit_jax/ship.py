"""`python -m cdeit_jax.ship`: a trained run made into a model folder that ships with the code
(`models/cdeit16`, `models/ktc2023`), or a model folder shipped again with a new calibration of
its std; the work is `infer.shipping`'s.

  python -m cdeit_jax.ship --workdir runs/cdeit16 --out models/cdeit16 --recipe "make ..." \\
      --scores uef2017=runs/cdeit16/eval_uef2017/metrics.json
  python -m cdeit_jax.ship --out models/cdeit16 --calibration FIT/uncertainty.json \\
      --scores simulated=EVAL/metrics.json
  python -m cdeit_jax.ship --out models/ktc2023 --set eval.refinement=objects \\
      --scores ktc2023_public=EVAL/metrics.json
"""

from __future__ import annotations

import os

from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax.common import logs
  from cdeit_jax.common.errors import InputError
  from cdeit_jax.infer import shipping

  logs.console()
  if FLAGS.workdir is None and (FLAGS.calibration is not None or FLAGS.set):
    m = shipping.ship_again(FLAGS.out, FLAGS.calibration, FLAGS.scores, FLAGS.set)
    what = f"{FLAGS.out} again with " + ", ".join(
      ([f"the calibration {FLAGS.calibration}"] if FLAGS.calibration else []) + FLAGS.set
    )
  else:
    if FLAGS.calibration is not None:
      raise InputError("--calibration ships the model folder --out again: leave --workdir out")
    if FLAGS.workdir is None:
      raise InputError("--workdir: give the trained run to ship (or --calibration FILE, --set)")
    m = shipping.ship(FLAGS.workdir, FLAGS.out, FLAGS.recipe, FLAGS.scores, FLAGS.step, FLAGS.set)
    what = f"step {m['step']} of {FLAGS.workdir} to {FLAGS.out}"
  size = sum(os.path.getsize(os.path.join(FLAGS.out, f)) for f in m["files"])
  print(
    f"shipped {what}: {len(m['files'])} files, {size / 1e6:.1f} MB, sha256 {m['sha256'][:16]}..."
  )


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("workdir", None, "the trained run")
  flags.DEFINE_string("out", None, "the model folder (e.g. models/cdeit16)", required=True)
  flags.DEFINE_string("recipe", "", "how the run was made (a make target, its commands)")
  flags.DEFINE_multi_string("scores", [], "NAME=PATH of an evaluation's metrics.json, repeated")
  flags.DEFINE_integer("step", None, "the step to ship (default: the best validated)")
  flags.DEFINE_multi_string(
    "set",
    [],
    "KEY=VALUE: an evaluation setting the model ships with (eval.*, sampling.*); without "
    "--workdir, the model folder --out shipped again with it",
  )
  flags.DEFINE_string(
    "calibration",
    None,
    "ship the model folder --out again with this std calibration (an uncertainty.json that "
    "eval.py --config.eval.fit_uncertainty=True wrote) and the --scores evaluated with it",
  )
  cli.run(main)
