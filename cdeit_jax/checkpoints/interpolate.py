"""WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022): a fine-tuned
run's weights interpolated with those it started from, (1 - alpha) start + alpha fine-tuned,
written as a checkpoint that eval.py, `cdeit_jax.reconstruct` and `cdeit_jax.ship` read.

  python -m cdeit_jax.interpolate --workdir runs/cdeit16_class --alpha 0.5 \\
      --out runs/cdeit16_wise

A run fine-tuned from another (`config.init_from`) stays in its basin, so the line between the
two is a family of models, and a point inside it can beat both ends where the data differ from
both training sets. models/cdeit16 is one (docs/checkpoints.md: the label-target run and its
class-target fine-tuning, alpha chosen on validation simulations). The checkpoint keeps the
fine-tuned run's config with `init_from` naming that run, so that a model shipped from it
records both trainings (`ship.started_from`), and says what it is made of in its `source`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from flax import nnx

from cdeit_jax.checkpoints import checkpoint, loading, shipped
from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import CdeitError, InputError


def wise_ft(model: nnx.Module, meta, alpha: float) -> dict[str, Any]:
  """Set `model` (a fine-tuned run's EMA weights, `meta` its `reader.Meta`) to (1 - alpha) x the
  EMA weights of the checkpoint its run started from + alpha x its own; returns {alpha, start}.
  The two must read their inputs alike: the same model, measuring system, normalisation
  statistics and condition calibration (else one line says which differ)."""
  where = f"--alpha {alpha}"
  if not (isinstance(alpha, (int, float)) and 0 < alpha <= 1):
    raise InputError(f"{where}: give the fine-tuned weights' share, a number in (0, 1]")
  start_path = meta.config.get("init_from")
  if not start_path:
    raise InputError(
      f"{where}: this run did not start from another (its config.init_from is empty); "
      "WiSE-FT interpolates a fine-tuned run with the checkpoint it started from"
    )
  workdir, step = start_step(meta.record, where)
  start, start_record = loading.load(workdir, weights="ema", step=step)
  start_mean, start_std = checkpoint.meta_stats(start_record)
  same = {
    "model": not loading.model_differences(loading.model_config(start_record), meta.config),
    "measuring system": start.system.device.signature == model.system.device.signature,
    "normalisation statistics": np.array_equal(start_mean, meta.mean)
    and np.array_equal(start_std, meta.std),
    "condition calibration": checkpoint.calibration_of(start) == checkpoint.calibration_of(model),
  }
  differ = [k for k, ok in same.items() if not ok]
  if differ:
    raise InputError(
      f"{where}: {workdir} step {step} (config.init_from) and this run differ in their "
      f"{', '.join(differ)}; their weights do not read the same inputs, so they do not "
      "interpolate"
    )
  mix = jax.tree.map(
    lambda s, f: (1 - alpha) * s + alpha * f,
    nnx.state(start, nnx.Param),
    nnx.state(model, nnx.Param),
  )
  nnx.update(model, mix)
  return {"alpha": float(alpha), "start": f"{fileio.resolve(workdir)} step {step}"}


def start_step(record: dict[str, Any], where: str) -> tuple[str, int]:
  """(workdir, step) a fine-tuned step (`record`: its metadata) started from: the step it
  recorded when it started (`loading.start_folder`: refused in one line where that step is gone
  or changed), or, for a run fine-tuned before starts were recorded, its config.init_from's
  newest step (logged)."""
  if record.get("init_from"):
    return loading.start_folder(record["init_from"], where)
  given = record["config"]["init_from"]
  if not fileio.path(given).exists():  # e.g. a shipped model's builder's run, elsewhere
    raise InputError(
      f"{where}: this run was fine-tuned from {given} (config.init_from), which is not here (a "
      "model records the path its builder trained from); interpolate where that run is, or "
      "fine-tune again from a start on this machine"
    )
  workdir, step = checkpoint.resolve(given)
  logs.log.warning(
    f"{where}: this run records no start step (fine-tuned by an earlier version); mixing "
    f"{workdir} step {step}, its config.init_from's newest"
  )
  return workdir, step


def write(workdir: str, alpha: float, out: str, step: int | None = None) -> str:
  """The WiSE-FT checkpoint of the fine-tuned run at `workdir` (its best validated step, or
  `step`) written to the workdir `out` (new, or an earlier WiSE-FT checkpoint, replaced whole
  with what was evaluated in it), at the same step; returns its step folder. `out` is local (the
  whole folder is replaced by one rename); `workdir` may be a bucket's."""
  import shutil

  if fileio.is_remote(out):
    raise InputError(
      f"--out {out}: the interpolated checkpoint is written to a local folder (it replaces an "
      "earlier one by a rename); give a local --out and copy it to the bucket afterwards"
    )
  shipped.refuse_write(out, "--out")
  fileio.output_folder(out, "--out")
  fileio.refuse_own_input(out, "--out", _inputs(workdir, step))
  out = fileio.resolve(out)
  if os.path.exists(out) and not _is_wise_ft(out):
    raise InputError(
      f"--out {out}: exists and is not a checkpoint written by this command; give a new folder"
    )
  stage = f"{out}.writing"
  shutil.rmtree(stage, ignore_errors=True)
  folder = _write(workdir, alpha, stage, step)
  if os.path.exists(out):
    shutil.rmtree(out)
  os.replace(stage, out)
  return folder.replace(stage, out, 1)


def _inputs(workdir: str, step: int | None) -> list[tuple[str, str]]:
  """The checkpoints the command reads (the fine-tuned run's and its start's), as `--out` must
  not be, lie in or hold them."""
  wd, st = checkpoint.resolve(workdir, step)
  found = [("--workdir's checkpoints", fileio.join(wd, checkpoint.CHECKPOINTS))]
  record = checkpoint.read_meta(wd, st)
  start = (record.get("init_from") or {}).get("workdir") or record["config"].get("init_from")
  if start:
    start_wd = checkpoint.locate(start)[0] if fileio.path(start).exists() else start
    found.append(("the checkpoints it started from", fileio.join(start_wd, checkpoint.CHECKPOINTS)))
  return found


def _is_wise_ft(path: str) -> bool:
  try:
    workdir, step = checkpoint.resolve(path)
    return str(checkpoint.read_meta(workdir, step).get("source", "")).startswith("WiSE-FT:")
  except CdeitError:  # not a checkpoint at all (MissingFile), or not one that reads
    return False


def _write(workdir: str, alpha: float, out: str, step: int | None) -> str:
  from cdeit_jax.checkpoints import reader

  with reader.open_run(workdir, step) as run:
    meta, skipped = run.first_readable()
    loaded = run.load(loading.resolve(meta.config, meta.record), weights="ema", passed=skipped)
    meta = loaded.meta
    made = wise_ft(loaded.model, meta, alpha)
    cfg = meta.config
    cfg.init_from = fileio.resolve(run.workdir)  # what it was made from: ship counts both
    return checkpoint.save_inference(
      out,
      loaded.model,
      cfg,
      mean=meta.mean,
      std=meta.std,
      step=meta.step,
      source=f"WiSE-FT: {1 - alpha:g} x {made['start']} + {alpha:g} x "
      f"{fileio.resolve(run.workdir)} step {meta.step} (EMA weights)",
    )
