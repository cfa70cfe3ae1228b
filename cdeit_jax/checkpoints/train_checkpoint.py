"""A training's checkpoints, in the format of `checkpoints.checkpoint`: the manager that keeps the
latest steps and the one with the lowest validation loss, and the whole training state (weights,
EMA, optimizer state, the data iterator's position) saved and restored onto any device count.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import orbax.checkpoint as ocp

from cdeit_jax.checkpoints import checkpoint
from cdeit_jax.common import fileio


@functools.cache
def _single_host_array_writes() -> None:
  """Write replicated arrays from one replica when there is one host.

  orbax's replica-parallel writes split each replicated array over its replicas with many small
  eager slices (19 of 22 s of a 40-step CPU run over 8 devices); they only pay off when the
  replicas sit on different hosts. Registered once per process (cached).
  """
  if jax.process_count() == 1:
    ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
    )


def train_manager(workdir: str, *, keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  """Manager for training: keeps the latest `keep` steps plus the one with the lowest
  validation loss (saved with `metrics={"val_loss": ...}`).

  `best_fn` makes orbax write each step's metrics into the step (its preservation policy alone
  would keep them in memory only, so a restarted run forgot which step was best).
  """
  from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

  _single_host_array_writes()
  policy = pp.AnyPreservationPolicy(
    [
      pp.LatestN(n=keep),
      pp.BestN(
        get_metric_fn=checkpoint.val_loss_of,
        reverse=True,
        n=1,
        keep_checkpoints_without_metrics=False,
      ),
    ]
  )
  # On an object store an unfinished step is a step folder without its commit marker, and it may
  # be a live writer's that lost its lease a moment ago: a run taking the workdir over leaves it
  # (it is never listed as a step, and is replaced when this run saves that step).
  return checkpoint.manager(
    workdir,
    options=ocp.CheckpointManagerOptions(
      preservation_policy=policy,
      best_fn=checkpoint.val_loss_of,
      best_mode="min",
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=not fileio.is_remote(workdir),
    ),
  )


def save_train(
  mngr: ocp.CheckpointManager, state, data_iter, meta: dict[str, Any], val_loss: float | None = None
) -> None:
  """Save a training state (every process calls this; orbax coordinates the writes)."""
  import grain

  items = {
    "params": ocp.args.StandardSave(state.params),
    "ema": ocp.args.StandardSave(state.ema),
    "opt_state": ocp.args.StandardSave(state.opt_state),
    "meta": ocp.args.JsonSave(meta),
  }
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  mngr.save(
    int(meta["step"]),
    args=ocp.args.Composite(**items),
    metrics=None if val_loss is None else {"val_loss": float(val_loss)},
  )


def restore_train(mngr: ocp.CheckpointManager, step: int, state, shardings, data_iter):
  """Restore (state, meta) at `step` onto `shardings` (any device count), and the data iterator.

  `state` is a fresh training state on `shardings` (its structure and placement are the
  target). The model's constants are not part of it: the caller sets their calibration from
  `meta` (`checkpoint.set_calibration`). Raises CheckpointError, one line naming the step and
  item, when an item cannot be read."""
  import grain

  where = f"checkpoint {mngr.directory}/{step}"
  meta = checkpoint.read_meta(fileio.dirname(str(mngr.directory)), step)
  if meta["format"] != checkpoint.FORMAT:
    raise checkpoint.CheckpointError(
      f"{where}: a {meta['format']!r} checkpoint; training resumes only "
      f"from {checkpoint.FORMAT!r} (start a new --workdir)"
    )
  items = {
    name: ocp.args.StandardRestore(
      checkpoint.restore_target(getattr(state, name), getattr(shardings, name))
    )
    for name in ("params", "ema", "opt_state")
  }
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  restored = {}
  for name, args in items.items():  # one item at a time, so a failure names its item
    try:
      restored[name] = mngr.restore(step, args=ocp.args.Composite(**{name: args}))[name]
    except Exception as e:
      raise checkpoint.failure(f"{where}/{name}", e) from None
  restored.pop("data", None)  # restored into `data_iter` in place
  step_array = jax.device_put(jax.numpy.int32(meta["step"]), shardings.step)
  return state.replace(step=step_array, **restored), meta
