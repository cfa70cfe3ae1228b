"""A markdown table of evaluations (eval.py output folders), CDEIT beside its floors.

  python -m cdeit_jax.report runs/demo/eval_simulated runs/demo/eval_uef2017
  python -m cdeit_jax.report runs/demo/eval_uef2017 --figure docs/demo_uef2017.png --rows 6

For each folder: CDEIT, the built-in Tikhonov (`eval.py --config.eval.tikhonov=True`), the GREIT
baseline where it was evaluated (`--config.eval.greit=True`) and the empty image, with the image
figures of merit (`metrics.IMAGE`: RMSE, PSNR, SSIM (square and disk), CC), and whether CDEIT
beats Tikhonov in the figures the verdict counts (RMSE, PSNR, CC) and the empty image in those it
has (RMSE, PSNR). The work is `infer.evaluation_table`'s.
"""

from __future__ import annotations

import sys

from absl import app, flags

from cdeit_jax.common import fileio
from cdeit_jax.infer.evaluation_table import figure, table

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  folders = argv[1:]
  if not folders:
    raise app.UsageError("give one or more eval.py --out folders")
  try:
    text, ok = table(folders)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(text)
  if FLAGS.figure:
    fileio.makedirs(fileio.dirname(FLAGS.figure))
    figure(folders[0], FLAGS.figure, FLAGS.rows)
    print(f"wrote {FLAGS.figure}")
  print(
    "CDEIT beats Tikhonov (RMSE, PSNR, CC) and the empty image (RMSE, PSNR) on every set"
    if ok
    else "CDEIT does NOT beat both floors on every set"
  )


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string(
    "figure",
    None,
    "also write a figure of the first folder's first --rows "
    "images (ground truth, CDEIT, std, Tikhonov) to this .png",
  )
  flags.DEFINE_integer("rows", 6, "rows of the figure", lower_bound=1)
  cli.run(main)
