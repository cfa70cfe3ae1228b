"""A markdown table of evaluations (eval.py output folders), CDEIT beside its floors.

  python -m cdeit_jax.report runs/demo/eval_simulated runs/demo/eval_uef2017
  python -m cdeit_jax.report runs/demo/eval_uef2017 --figure docs/demo_uef2017.png --rows 6

For each folder: CDEIT, the built-in Tikhonov (`eval.py --config.eval.tikhonov=True`) and the
empty image, with RMSE, PSNR, SSIM (square and disk) and CC, and whether CDEIT beats Tikhonov in
RMSE, PSNR and CC and the empty image in RMSE and PSNR (lower RMSE, higher PSNR and CC are better).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from absl import app, flags

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError

METHODS = (("cdeit", "CDEIT"), ("tikhonov", "Tikhonov (ours)"), ("empty", "empty image"))
FLAGS = flags.FLAGS
COLUMNS = (
  ("rmse", "RMSE", "{:.4f}"),
  ("psnr", "PSNR", "{:.2f}"),
  ("ssim", "SSIM", "{:.3f}"),
  ("ssim_disk", "SSIM disk", "{:.3f}"),
  ("cc", "CC", "{:.3f}"),
)


def beats(m: dict, floor: dict, keys: Sequence[str]) -> bool:
  """Whether metrics `m` are better than `floor` in every one of `keys`."""
  better = {"rmse": lambda a, b: a < b, "psnr": lambda a, b: a > b, "cc": lambda a, b: a > b}
  return all(better[k](m[k], floor[k]) for k in keys)


def table(folders: Sequence[str]) -> tuple[str, bool]:
  """(markdown table, whether CDEIT beats both floors everywhere)."""
  lines = [
    "| set | method | " + " | ".join(c[1] for c in COLUMNS) + " |",
    "|---|---|" + "---|" * len(COLUMNS),
  ]
  notes = []
  ok = True
  for folder in folders:
    path = fileio.join(folder, "metrics.json")
    try:
      r = json.loads(fileio.path(path).read_text())
    except (OSError, ValueError) as e:
      raise InputError(f"{path}: not an eval.py output ({e}); run eval.py --out {folder}") from e
    m, s = r["metrics"], r["settings"]
    name = f"{fileio.path(folder).name}: {s['data']} ({s['examples']})"
    for key, label in METHODS:
      if key in m:
        cells = [fmt.format(m[key][c]) if c in m[key] else "-" for c, _, fmt in COLUMNS]
        lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
        name = ""
    if "tikhonov" not in m:
      raise InputError(
        f"{path}: no Tikhonov baseline; evaluate with eval.py --config.eval.tikhonov=True"
      )
    ok &= beats(m["cdeit"], m["tikhonov"], ("rmse", "psnr", "cc"))
    ok &= beats(m["cdeit"], m["empty"], ("rmse", "psnr"))
    lead = 1 - m["cdeit"]["rmse"] / m["tikhonov"]["rmse"]
    notes.append(
      f"- {fileio.path(folder).name}: CDEIT's RMSE {100 * lead:.1f} % under "
      "Tikhonov's" + (uncertainty_note(m["uncertainty"]) if "uncertainty" in m else "")
    )
  return "\n".join(lines + [""] + notes), ok


def uncertainty_note(u: dict) -> str:
  return (
    f"; std x {u['scale']:.2f} covers {100 * u['coverage_1std']:.1f} % / "
    f"{100 * u['coverage_2std']:.1f} % of the pixel errors at 1 / 2 std (calibrated "
    f"Gaussian 68.3 / 95.4; unscaled {100 * u['raw_coverage_1std']:.1f} / "
    f"{100 * u['raw_coverage_2std']:.1f}), std-error correlation over images "
    f"{u['std_error_cc']:.2f}"
  )


def figure(folder: str, out: str, rows: int = 6) -> None:
  """A compact figure of an evaluation's first `rows` images: ground truth | CDEIT | std (with
  several samples) | the built-in Tikhonov of the same voltages (scaled as in the metrics)."""
  import numpy as np

  from cdeit_jax import config_lib, eit
  from cdeit_jax.checkpoints import loading
  from cdeit_jax.data import npz_files
  from cdeit_jax.infer import metrics, outputs

  s = json.loads(fileio.path(fileio.join(folder, "metrics.json")).read_text())["settings"]
  z = npz_files.read_npz(fileio.join(folder, "predictions.npz"))
  names = [str(n) for n in z["names"][:rows]]
  ys = (
    np.stack(
      [npz_files.read_npz(fileio.join(s["data_path"], n), ("ys",))["ys"].reshape(-1) for n in names]
    )
    / s["voltage_ratio"]
  )
  device = loading.resolve(config_lib.from_json(s["config"])).device  # the model's system
  tik = np.stack([metrics.scale_baseline(b) for b in eit.default_tikhonov(device)(ys)])
  std = z["std"][:rows] if "std" in z else None
  fileio.atomic_write(
    out,
    lambda p: outputs.save_figure(
      p, names, z["target"][:rows], z["pred"][:rows], std, {"tikhonov": tik}
    ),
  )


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
