"""The markdown table of evaluations (eval.py output folders), CDEIT beside its floors, and its
figure (`python -m cdeit_jax.report`; eval.py prints `uncertainty_note` too).

For each folder: CDEIT, the built-in Tikhonov (`eval.py --config.eval.tikhonov=True`), the GREIT
baseline where it was evaluated (`--config.eval.greit=True`) and the empty image, with the image
figures of merit (`metrics.IMAGE`: RMSE, PSNR, SSIM (square and disk), CC), and whether CDEIT
beats Tikhonov in the figures the verdict counts (RMSE, PSNR, CC) and the empty image in those it
has (RMSE, PSNR).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import metrics

METHODS = (
  ("cdeit", "CDEIT"),
  ("tikhonov", "Tikhonov (ours)"),
  ("greit", "GREIT (ours)"),
  ("empty", "empty image"),
)
JUDGED = tuple(f.name for f in metrics.IMAGE if f.judged)  # CDEIT beats Tikhonov in these


def beats(m: dict, floor: dict, keys: Sequence[str]) -> bool:
  """Whether metrics `m` are better than `floor` in every one of `keys`."""
  return all(metrics.FIGURES[k].is_better(m[k], floor[k]) for k in keys)


def table(folders: Sequence[str]) -> tuple[str, bool]:
  """(markdown table, whether CDEIT beats both floors everywhere)."""
  lines = [
    "| set | method | " + " | ".join(f.label for f in metrics.IMAGE) + " |",
    "|---|---|" + "---|" * len(metrics.IMAGE),
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
        cells = [f.fmt.format(m[key][f.name]) if f.name in m[key] else "-" for f in metrics.IMAGE]
        lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
        name = ""
    if "tikhonov" not in m:
      raise InputError(
        f"{path}: no Tikhonov baseline; evaluate with eval.py --config.eval.tikhonov=True"
      )
    ok &= beats(m["cdeit"], m["tikhonov"], JUDGED)
    ok &= beats(m["cdeit"], m["empty"], [k for k in JUDGED if metrics.FIGURES[k].empty])
    head = metrics.HEADLINE
    lead = 1 - m["cdeit"][head.name] / m["tikhonov"][head.name]
    notes.append(
      f"- {fileio.path(folder).name}: CDEIT's {head.label} {100 * lead:.1f} % under "
      "Tikhonov's" + (uncertainty_note(m["uncertainty"]) if "uncertainty" in m else "")
    )
  return "\n".join(lines + [""] + notes), ok


def uncertainty_note(u: dict) -> str:
  two = u.get("scale_2std", 2 * u["scale"])  # an evaluation before the conformal intervals
  return (
    f"; std x {u['scale']:.2f} / x {two:.2f} ({u.get('calibration', 'gaussian')}) covers "
    f"{100 * u['coverage_1std']:.1f} % / {100 * u['coverage_2std']:.1f} % of the pixel errors "
    f"at 1 / 2 std (stated 68.3 / 95.4; unscaled {100 * u['raw_coverage_1std']:.1f} / "
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
