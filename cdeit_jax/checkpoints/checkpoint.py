"""The cdeit-jax checkpoint format (orbax), shared by convert, train and eval.

Reading a model back is `cdeit_jax.checkpoints.loading.load`. A workdir holds `checkpoints/<step>/`,
each written by an orbax `CheckpointManager` under a temporary name and renamed when complete, with
items shaped like the training state:
  params     the trained weights (nnx.Param), as `nnx.state(model, nnx.Param)`
  ema        their EMA (what the authors' `best.pt` holds)
  opt_state  the optimizer state (training only)
  data       the grain iterator's position (training only)
  meta       JSON: format, step, the full config, normalisation statistics, the physics-informed
             calibration, which weight sets are present, where the weights came from, the
             measuring system (`device`: electrodes and patterns as arrays)
  metrics    orbax's own record of the validation loss; the retention policy and `best_step`
             read it, so the best step survives any number of restarts
Variables recomputed from the config (the sin-cos position table, the linear operator of the
physics-informed condition) are not stored. An inference checkpoint (convert, `save_inference`)
holds one weight set and `meta`. A training's manager, its saves and restores of the whole
training state are `checkpoints.train_checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from cdeit_jax.checkpoints import shipped
from cdeit_jax.common import compat, fileio, logs, stages
from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.common.variables import Calibration
from cdeit_jax.data import stats

FORMAT = "cdeit-jax checkpoint v2"
CHECKPOINTS = "checkpoints"
# a translated run (`python -m cdeit_jax.translate`): its device, and the model it reads with
TRANSLATION_FILE, MODEL_FOLDER = "translation.npz", "model"
STAGE = ".import-"  # in a workdir: an inference step being written (`save_inference`)
T = TypeVar("T")
WEIGHT_ITEMS = {"raw": "params", "ema": "ema"}


class CheckpointError(InputError):
  """A checkpoint that cannot be read (damaged, incomplete, or not ours); one line, with the
  underlying error in the debug log."""


def failure(where: str, e: BaseException) -> CheckpointError:
  """One line naming `where` (a step folder and item), the array and file that TensorStore names,
  and the innermost reason; the whole error goes to the debug log."""
  logs.debug.debug("%s", where, exc_info=e)
  array, file, reason = compat.tensorstore_failure(e)
  named = [f"array {array}"] if array else []
  named += [f"file {file}"] if file else []
  detail = f" ({', '.join(named)})" if named else ""
  return CheckpointError(f"{where}: unreadable{detail}: {type(e).__name__}: {reason}")


def weights_of(model: nnx.Module) -> nnx.State:
  """The model's trained weights (what a weight item holds)."""
  return nnx.state(model, nnx.Param)


def _calibration_vars(tree) -> list[tuple[str, nnx.Variable]]:
  state = tree if isinstance(tree, nnx.State) else nnx.state(tree, Calibration)
  return [
    ("/".join(map(str, path)), v)
    for path, v in nnx.to_flat_state(state)
    if isinstance(v, Calibration)
  ]


def calibration_of(tree: nnx.Module | nnx.State) -> dict[str, list[float]]:
  """The physics-informed condition's training-set calibration as JSON ({path: values}) of a
  model or a state holding its Calibration variables."""
  return {k: np.asarray(v.get_value()).ravel().tolist() for k, v in _calibration_vars(tree)}


def set_calibration(
  tree: nnx.Module | nnx.State, calibration: dict[str, list[float]], prefix: bool = False
) -> None:
  """Set the Calibration variables of a model or state from `calibration_of`'s record, in place,
  each value keeping its placement. `prefix`: a recorded vector shorter than its variable sets
  the variable's leading values (a fine-tuning's start with fewer condition channels, which come
  first; the rest keep their measured values)."""
  for key, v in _calibration_vars(tree):
    if key not in calibration:
      raise CheckpointError(f"checkpoint metadata has no calibration for {key!r}")
    old = v.get_value()
    try:
      value = np.asarray(calibration[key], np.float32)
    except (TypeError, ValueError):
      raise CheckpointError(f"checkpoint calibration {key!r} is not a list of numbers") from None
    if prefix and old.ndim == 1 and 0 < value.size < old.size:
      value = np.concatenate([value, np.asarray(old)[value.size :]])
    if value.size != old.size:
      raise CheckpointError(
        f"checkpoint calibration {key!r} has {value.size} values, the model {old.size}"
      )
    if not np.isfinite(value).all():
      raise CheckpointError(f"checkpoint calibration {key!r} holds NaN or infinite values")
    v.set_value(jax.device_put(value.reshape(old.shape), old.sharding))


def restore_target(tree, shardings):
  """ShapeDtypeStructs of `tree` placed on `shardings` (one sharding, or a matching tree)."""
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shardings), tree)
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
  )


def val_loss_of(metrics: dict) -> float:
  """A step's validation loss in its orbax metrics (what the best step is chosen by)."""
  return metrics["val_loss"]


def manager(
  workdir: str, *, options: ocp.CheckpointManagerOptions | None = None, read_only: bool = False
) -> ocp.CheckpointManager:
  """The workdir's CheckpointManager; it tracks `val_loss` so `best_step()` works.

  `read_only` only means "do not create the folder" (orbax's own read_only mode logs warnings).
  """
  directory = fileio.join(fileio.resolve(workdir), CHECKPOINTS)
  if options is None:
    options = ocp.CheckpointManagerOptions(
      create=not read_only, enable_async_checkpointing=False, best_fn=val_loss_of, best_mode="min"
    )
  return ocp.CheckpointManager(directory, options=options)


def make_meta(
  cfg: ml_collections.ConfigDict,
  *,
  step: int,
  mean: np.ndarray,
  std: np.ndarray,
  weights: list[str],
  device: dict[str, Any],
  calibration: dict[str, list[float]] | None = None,
  source: str = "",
  **extra: Any,
) -> dict[str, Any]:
  """A step's metadata; `device`: the model's measuring system as arrays (`Layout.record`), so
  that the model loads without the device file it was trained for (every step keeps it)."""
  mean, std = stats.check_stats(mean, std, source="statistics to save")
  return {
    "format": FORMAT,
    "step": int(step),
    "model": cfg.model.to_dict(),
    "config": json.loads(cfg.to_json_best_effort()),
    # float32 -> Python float -> JSON -> float32 round-trips exactly.
    "stats": {"mean": mean.ravel().tolist(), "std": std.ravel().tolist()},
    "calibration": calibration or {},
    "weights": sorted(weights),
    "source": source,
    "device": device,
    **extra,
  }


def refuse_import(workdir: str, flag: str = "--workdir") -> None:
  """The one check of a workdir an inference checkpoint is saved into (convert, interpolate,
  ship's stage), before any work: refused in one line saying what to do when it is a file, a
  training run's (metrics.jsonl: its retention could delete the step, its steps would be taken
  for it), a translated run's (its model is MODEL_FOLDER) or holds a model already (any step:
  orbax would skip a lower one without a word, and a reader takes the newest or best)."""
  where = fileio.path(workdir)
  if where.exists() and not where.is_dir():
    raise InputError(f"{flag} {workdir}: exists and is not a folder; give a new folder")
  if (where / "metrics.jsonl").exists():
    raise InputError(
      f"{flag} {workdir} is a training run's (it holds metrics.jsonl): give a new {flag} (an "
      "imported step among its steps would be taken for one of them, and its retention could "
      "delete it)"
    )
  if (where / TRANSLATION_FILE).exists() or (where / MODEL_FOLDER).exists():
    raise InputError(
      f"{flag} {workdir} is a translated run's (python -m cdeit_jax.translate; its model is "
      f"{fileio.join(workdir, MODEL_FOLDER)}), which reads no checkpoint of its own: give a new "
      f"{flag}"
    )
  steps = all_steps(workdir) if (where / CHECKPOINTS).is_dir() else []
  if steps:
    raise InputError(
      f"{flag} {workdir} holds a model already ({CHECKPOINTS}/ has step "
      f"{', '.join(map(str, steps))}, which its readers would take): give a new {flag}, or "
      f"remove {fileio.join(workdir, CHECKPOINTS)} to replace that model"
    )


def save_inference(
  workdir: str,
  model: nnx.Module,
  cfg: ml_collections.ConfigDict,
  *,
  mean: np.ndarray,
  std: np.ndarray,
  step: int = 0,
  source: str = "",
  weights: str = "ema",
  extra: dict[str, Any] | None = None,
  files: dict[str, str] | None = None,
) -> str:
  """Save one weight set (`ema` or `raw`) with its metadata (`extra`: more fields of it, e.g.
  an imported model file's training record) and `files` ({name: text} in the step folder, e.g.
  the uncertainty scale) as the only step of `workdir` (`refuse_import`): written whole in a
  hidden stage beside it and moved into place complete, so a reader finds all of it or nothing;
  returns the step's directory."""
  if weights not in WEIGHT_ITEMS:
    raise InputError(f"weights must be one of {sorted(WEIGHT_ITEMS)}, got {weights!r}")
  if not (isinstance(step, int) and step >= 0):
    raise InputError(f"step {step!r}: must be an integer >= 0 (--step)")
  refuse_import(workdir)
  meta = make_meta(
    cfg,
    step=step,
    mean=mean,
    std=std,
    weights=[weights],
    source=source,
    calibration=calibration_of(model),
    device=model.system.device.record(),
    **(extra or {}),
  )
  for stale in stages.stale(workdir, STAGE):  # a killed import's (the step was not published)
    fileio.remove_tree(stale)
  stage = fileio.join(workdir, f"{STAGE}{os.getpid()}-{secrets.token_hex(4)}")
  try:
    # No validation loss to track: a manager without `best_fn` (with one, orbax warns
    # "Requested `tracked_metric`; did not provide metrics."); the step is the same on disk.
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
    with manager(stage, options=options) as mngr:
      items = {WEIGHT_ITEMS[weights]: ocp.args.StandardSave(weights_of(model))}
      mngr.save(step, args=ocp.args.Composite(**items, meta=ocp.args.JsonSave(meta)))
      mngr.wait_until_finished()
    staged = fileio.join(stage, CHECKPOINTS, str(step))
    for name, text in (files or {}).items():
      fileio.write_text(fileio.join(staged, name), text)
    final = fileio.join(fileio.resolve(workdir), CHECKPOINTS, str(step))
    fileio.move(staged, final)
  finally:
    fileio.remove_tree(stage)
  return final


def step_folder(path: str) -> int | None:
  """The step of a step folder (`.../checkpoints/<digits>`), recognised by its place, not by its
  name alone (a workdir may be called `runs/2024`); None for anything else."""
  p = fileio.path(path)
  return int(p.name) if p.name.isdigit() and p.parent.name == CHECKPOINTS else None


def locate(path: str) -> tuple[str, int | None]:
  """(workdir, the step of a step folder or None) for a workdir, its `checkpoints/` folder, or
  one `checkpoints/<step>`; lists nothing."""
  p = fileio.path(path)
  path = str(p)
  if not p.exists():
    raise MissingFile(f"checkpoint {path}: no such file or directory{shipped.missing_note(path)}")
  if step_folder(path) is not None:
    shipped.verify(str(p.parent.parent))
    return str(p.parent.parent), step_folder(path)
  if p.name == CHECKPOINTS:
    p = p.parent
    path = str(p)
  if not (p / CHECKPOINTS).is_dir():
    raise MissingFile(f"checkpoint {path}: no {CHECKPOINTS}/ folder here ({_what_instead(p)})")
  shipped.verify(path)  # a model folder that ships with the code: its files as its manifest's
  return path, None


def _what_instead(p: epath.Path) -> str:
  """What to give instead of folder `p`, which holds no checkpoints: a translated run's model,
  or a device run to make again, or a workdir."""
  if (p / TRANSLATION_FILE).exists():
    return (
      f"a translated run: eval.py and reconstruct read it as it is; its model is "
      f"{p / MODEL_FOLDER}, the one to give here"
    )
  if any((p / n).exists() for n in (MODEL_FOLDER, "device.npz")):
    return (
      "a device run that make device-model did not finish: run make device-model again with "
      f"its DEVICE and RUN={p}"
    )
  return "give a workdir written by train.py or `python -m cdeit_jax.convert`"


def resolve(path: str, step: int | None = None) -> tuple[str, int]:
  """(workdir, step) for a workdir (its newest step, or `step`), its `checkpoints/` folder, or
  one `checkpoints/<step>`."""
  path, folder_step = locate(path)
  if folder_step is not None:
    return path, folder_step
  return path, pick_step(path, all_steps(path), step)


def pick_step(path: str, steps: list[int], step: int | None = None) -> int:
  """`step` if it is among a workdir's `steps`, else the newest; MissingFile naming what there
  is otherwise."""
  if not steps:
    raise MissingFile(f"checkpoint {path}: {CHECKPOINTS}/ holds no finished checkpoint")
  if step is None:
    return max(steps)
  if step not in steps:
    raise MissingFile(f"checkpoint {path}: no step {step} (have {sorted(steps)})")
  return step


def fingerprint(workdir: str, step: int) -> str:
  """SHA-256 of a step's EMA weights and metadata (each file's path, size and bytes, in order):
  recorded by a fine-tuning for the step it starts from, so that a later use of that start
  (`checkpoints.interpolate`) knows the step is still the one it trained from."""
  base = fileio.path(fileio.join(workdir, CHECKPOINTS, str(step)))
  h = hashlib.sha256()
  for item in (WEIGHT_ITEMS["ema"], "meta"):
    for rel in (f"{item}/{f}" for f in fileio.files_below(base / item)):
      data = (base / rel).read_bytes()
      h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
  return h.hexdigest()


def all_steps(workdir: str) -> list[int]:
  with manager(workdir, read_only=True) as mngr:
    return sorted(mngr.all_steps())


def read_meta(
  path: str, step: int | None = None, *, mngr: ocp.CheckpointManager | None = None
) -> dict[str, Any]:
  """A step's metadata, checked (CheckpointError when damaged or not ours). With `mngr` (the
  workdir's open manager) `path` must be the workdir and `step` a listed step: nothing is
  listed or opened again."""
  if mngr is None:
    workdir, step = resolve(path, step)
    with manager(workdir, read_only=True) as opened:
      return read_meta(workdir, step, mngr=opened)
  where = f"checkpoint {path}/{CHECKPOINTS}/{step}"
  try:
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  except Exception as e:  # orbax raises several types for unreadable items
    raise failure(f"{where}/meta/metadata", e) from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise CheckpointError(f"{where}: not a {FORMAT!r} checkpoint")
  problem = meta_problem(meta, step)
  if problem:
    raise CheckpointError(f"{where}/meta/metadata: {problem} (edited or damaged)")
  return meta


def meta_problem(meta: dict[str, Any], step: int) -> str | None:
  """What is wrong with a checkpoint's metadata fields, or None."""
  if meta.get("step") != step or isinstance(meta.get("step"), bool):
    return f"step is {meta.get('step')!r}, the folder says {step}"
  for key in ("model", "config"):
    if not isinstance(meta.get(key, {}), dict):
      return f"{key} is a {type(meta[key]).__name__}, not a mapping"
  st = meta.get("stats")
  if not (
    isinstance(st, dict)
    and all(
      isinstance(st.get(k), list)
      and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in st[k])
      for k in ("mean", "std")
    )
  ):
    return "stats must hold the lists mean and std of numbers"
  if not (
    isinstance(meta.get("weights"), list)
    and meta["weights"]
    and set(meta["weights"]) <= set(WEIGHT_ITEMS)
  ):
    return f"weights is {meta.get('weights')!r}, not a list of {sorted(WEIGHT_ITEMS)}"
  if not isinstance(meta.get("device"), dict):
    return "device (the measuring system) is missing or not a mapping"
  return None


def first_intact(
  steps: list[int], load: Callable[[int], T], where: str, passed: dict[int, str] | None = None
) -> tuple[int, T, dict[str, str]]:
  """(step, load(step), skipped) of the first of `steps` that loads completely (newest first for
  a resume, best first for an evaluation): one rule for training and evaluation. `skipped`
  ({step: reason}, the first reason found) holds `passed` (steps passed over before) and each
  step passed over here, a step deleted since it was listed (a training's retention) included;
  TensorStore's noise of a failed read goes to the debug log. CheckpointError listing every
  reason when none loads."""
  skipped = dict(passed or {})
  with logs.StderrCapture() as capture:
    for step in steps:
      try:
        return step, load(step), skipped
      except (CheckpointError, MissingFile) as e:
        capture.failed = True
        skipped.setdefault(step, str(e))
  reasons = "\n  ".join(f"step {st}: {r}" for st, r in skipped.items())
  log = logs.debug_log_path()  # only where the command keeps one (a training's, an evaluation's)
  gone = lambda st: not fileio.path(fileio.join(where, str(st))).exists()
  if steps and fileio.path(where).is_dir() and all(map(gone, steps)):
    hint = (  # every step gone since it was listed: a training saving and retaining, not damage
      "its steps were removed while they were read (a training saving into it keeps its "
      "newest few): run the command again"
    )
  else:
    hint = (
      f"The whole errors are in {log}; " if log else ""
    ) + "move the steps away to start afresh"
  raise CheckpointError(f"no checkpoint in {where} can be read:\n  {reasons}\n" + hint)


def first_readable(workdir: str, steps: list[int]) -> tuple[int, dict[str, Any], dict[int, str]]:
  """(step, meta, skipped) of the first of `steps` whose metadata reads (`first_intact`)."""
  return first_intact(steps, lambda st: read_meta(workdir, st), fileio.join(workdir, CHECKPOINTS))


def meta_stats(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  return stats.check_stats(
    np.asarray(meta["stats"]["mean"]),
    np.asarray(meta["stats"]["std"]),
    source="checkpoint metadata",
  )


def restore_item(
  workdir: str, step: int, item: str, like, sharding, *, mngr: ocp.CheckpointManager | None = None
):
  """One item of a step restored into the structure of `like` on `sharding` (CheckpointError,
  one line naming the step and item, when it cannot be read); `mngr`: the workdir's open
  manager, if the caller holds one."""
  if mngr is None:
    with manager(workdir, read_only=True) as opened:
      return restore_item(workdir, step, item, like, sharding, mngr=opened)
  try:
    return mngr.restore(
      step,
      args=ocp.args.Composite(**{item: ocp.args.StandardRestore(restore_target(like, sharding))}),
    )[item]
  except Exception as e:  # orbax and TensorStore raise many types for unreadable items
    raise failure(f"checkpoint {workdir}/{CHECKPOINTS}/{step}/{item}", e) from None


def best_step(workdir: str) -> int | None:
  """The kept step with the lowest validation loss (None if none was validated)."""
  return (ranked_steps(workdir) or [None])[0]


def ranked_steps(workdir: str, mngr: ocp.CheckpointManager | None = None) -> list[int]:
  """Validated steps, best (lowest validation loss) first, from orbax's per-step metrics. `mngr`:
  the workdir's open manager."""
  return [s for _, s in scored_steps(workdir, mngr)]


def scored_steps(
  workdir: str, mngr: ocp.CheckpointManager | None = None
) -> list[tuple[float, int]]:
  """(validation loss, step) of the validated steps, best first (`ranked_steps`)."""
  if mngr is None:
    workdir, _ = resolve(workdir)
    with manager(workdir, read_only=True) as opened:
      return scored_steps(workdir, opened)
  scored = []
  for s in mngr.all_steps():
    try:
      m = mngr.metrics(s)
    except Exception as e:  # a damaged step is skipped here; loading it reports it
      logs.debug.debug("metrics of step %s unreadable", s, exc_info=e)
      continue
    if m and m.get("val_loss") is not None and np.isfinite(m["val_loss"]):
      scored.append((float(m["val_loss"]), s))
  return sorted(scored)
