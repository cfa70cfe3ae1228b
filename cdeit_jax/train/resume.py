"""Resuming a run: the plan (the newest step whose metadata reads, and whether the config may
resume from it: `check_resume`, `check_device`), then the restore (the newest step that restores
completely, damaged steps moved aside to `WORKDIR/damaged/`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, train_checkpoint
from cdeit_jax.common import fileio
from cdeit_jax.train import training

# Settings a run cannot resume under: they change the state's shapes or the data order.
_RESUME_FIXED = ("batch_size",)
# Settings that may change on resume, but then the run no longer matches an uninterrupted one.
_RESUME_WARN = (
  "seed",
  "steps",
  "accum_steps",
  "optimizer",
  "ema",
  "diffusion",
  "data.seed",
  "data.path",
  "data.train_split",
  "data.source",
)


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_resume(cfg: ml_collections.ConfigDict, meta: dict, where: str) -> list[str]:
  """Refuse a config the checkpoint cannot resume under; returns warnings for changed settings
  that resume but break equality with an uninterrupted run."""
  now = _flat(json.loads(cfg.to_json_best_effort()))
  was = _flat(meta.get("config", {}))
  changed = lambda keys: [
    k
    for k in sorted(set(now) | set(was))
    if any(k == p or k.startswith(p + ".") for p in keys) and now.get(k) != was.get(k)
  ]
  model = [k for k in changed(("model",)) if k.split(".", 1)[1] not in loading.RUNTIME_MODEL_KEYS]
  fixed = model + changed(_RESUME_FIXED)
  if fixed:
    diff = "; ".join(f"config.{k}: checkpoint {was.get(k)!r}, now {now.get(k)!r}" for k in fixed)
    raise checkpoint.CheckpointError(
      f"cannot resume from {where} with a changed config ({diff}); rerun with the "
      "checkpoint's settings or give a new --workdir"
    )
  simulated = config_lib.training_source(cfg).simulates
  warn = changed(_RESUME_WARN + (("simulator",) if simulated else ()))
  if cfg.optimizer.schedule == "constant":  # then more steps only extend the same run
    warn = [k for k in warn if k != "steps"]
  return [
    f"warning: resuming {where} with changed config.{k}: {was.get(k)!r} -> "
    f"{now.get(k)!r} (the run no longer equals an uninterrupted one)"
    for k in warn
  ]


def check_device(meta: dict, device, where: str) -> None:
  """Refuse to resume when the config's measuring system is not the one the checkpoint was
  trained for (a device file changed or replaced since)."""
  from cdeit_jax.eit import layout

  was = layout.Layout.from_record(meta["device"], f"{where}: its device")
  if not was.same_system(device):
    raise checkpoint.CheckpointError(
      f"cannot resume from {where}: it was trained for {was.describe()}, the config now gives "
      f"{device.describe()} (config.simulator.layout; a device file changed?); give the "
      "device it was trained for, or a new --workdir"
    )


@dataclasses.dataclass
class ResumePlan:
  """Where the state comes from: None (a new run) or the newest step whose metadata reads."""

  meta: dict | None
  warnings: list[str]
  skipped: dict[int, str]  # unreadable steps passed over: {step: reason}

  @property
  def checkpoint_stats(self):
    return None if self.meta is None else checkpoint.meta_stats(self.meta)


def plan_resume(mngr, cfg: ml_collections.ConfigDict, workdir: str) -> ResumePlan:
  """Read the newest readable step's metadata and check that `cfg` may resume from it."""
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return ResumePlan(None, [], {})
  _, meta, skipped = checkpoint.first_readable(workdir, steps)
  if cfg.steps < int(meta["step"]):
    raise checkpoint.CheckpointError(
      f"config.steps={cfg.steps} is below the step of {mngr.directory}/{meta['step']}: "
      f"nothing to train; give --config.steps above {meta['step']} to train on, or a new "
      "--workdir"
    )
  return ResumePlan(meta, check_resume(cfg, meta, f"{mngr.directory}/{meta['step']}"), skipped)


def restore(
  mngr, workdir: str, plan: ResumePlan, state, compiled: training.CompiledStep, constants, data_item
) -> tuple[Any, dict, int, list[str], list[str]]:
  """(state, meta, step, warnings, report lines) from the newest step that restores completely,
  the calibration set in `constants`; damaged steps are moved aside (kept for inspection)."""
  load = lambda st: train_checkpoint.restore_train(
    mngr, st, state, compiled.state_shardings, data_item
  )
  steps = sorted(mngr.all_steps(), reverse=True)
  step, (state, meta), skipped = checkpoint.first_intact(
    steps, load, str(mngr.directory), plan.skipped
  )
  checkpoint.set_calibration(constants, meta.get("calibration", {}))
  warnings = [f"skipping checkpoint step {st}: {reason}" for st, reason in skipped.items()]
  report = []
  damaged = [st for st in steps if st > step]  # each failed to restore
  if damaged:
    report += [f"moved damaged checkpoint to {path}" for path in _set_aside(workdir, damaged)]
    mngr.reload()  # the manager forgets the steps moved away
  report.append(f"resumed from {mngr.directory}/{step}")
  return state, meta, step, warnings, report


def _set_aside(workdir: str, steps: list[int]) -> list[str]:
  """Move damaged step folders to `<workdir>/damaged/` (kept for inspection, out of orbax's way
  so that the step can be written again)."""
  moved = []
  if jax.process_index() == 0:
    for step in steps:
      target = fileio.join(workdir, "damaged", f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
      fileio.move(fileio.join(workdir, checkpoint.CHECKPOINTS, str(step)), target)
      moved.append(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("cdeit_jax damaged checkpoints moved")
  return moved
