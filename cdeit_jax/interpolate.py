"""WiSE-FT: a fine-tuned run's weights interpolated with those it started from, (1 - alpha) start
+ alpha fine-tuned, written as a checkpoint (`cdeit_jax.checkpoints.interpolate` does it).

  python -m cdeit_jax.interpolate --workdir runs/cdeit16_class --alpha 0.5 \\
      --out runs/cdeit16_wise
"""

from __future__ import annotations

from absl import flags

from cdeit_jax.checkpoints.interpolate import write
from cdeit_jax.common import logs

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv

  logs.console()
  folder = write(FLAGS.workdir, FLAGS.alpha, FLAGS.out, FLAGS.step)
  print(f"wrote {folder}")


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("workdir", None, "the fine-tuned run (config.init_from set)", required=True)
  flags.DEFINE_float("alpha", None, "the fine-tuned weights' share, in (0, 1]", required=True)
  flags.DEFINE_string("out", None, "a new workdir for the interpolated checkpoint", required=True)
  flags.DEFINE_integer("step", None, "the fine-tuned run's step (default: the best validated)")
  cli.run(main)
