"""The cdeit-jax checkpoint format (orbax), shared by convert, train and eval.

A workdir holds `checkpoints/<step>/` written atomically by an orbax `CheckpointManager`, with
items:
  meta        JSON: format, step, model settings, full config, normalisation statistics,
              which weight sets are present, where the weights came from
  params      the raw model weights (trained parameters and the fixed position table)
  ema_params  the EMA weights (what the authors' `best.pt` holds)
Training adds its own items (optimizer state, RNG, data iterator) beside these.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from cdeit_jax import config_lib, stats
from cdeit_jax.conditioning import Fixed
from cdeit_jax.model import CDEIT

FORMAT = "cdeit-jax checkpoint v1"
CHECKPOINTS = "checkpoints"
WEIGHT_ITEMS = {"raw": "params", "ema": "ema_params"}
WEIGHTS = nnx.Any(nnx.Param, Fixed)  # what a weight set holds


def weights_of(model: nnx.Module) -> dict:
  """The model's weights as a pure nested dict (string keys, for orbax)."""
  return _str_keys(nnx.state(model, WEIGHTS).to_pure_dict())


def _str_keys(tree):
  if isinstance(tree, dict):
    return {str(k): _str_keys(v) for k, v in tree.items()}
  return tree


def _restore_keys(tree, like):
  """Map string keys of a restored tree back to the (int) keys of `like`."""
  if isinstance(like, dict):
    return {k: _restore_keys(tree[str(k)], v) for k, v in like.items()}
  return tree


def _restore_target(tree, shardings):
  """ShapeDtypeStructs of `tree` placed on `shardings` (one sharding, or a matching tree)."""
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shardings), tree)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree,
                      shardings)


def manager(workdir: str, *, options: ocp.CheckpointManagerOptions | None = None,
            read_only: bool = False) -> ocp.CheckpointManager:
  """The workdir's CheckpointManager (orbax writes each step to a temporary name, then renames).

  `read_only` only means "do not create the folder" (orbax's own read_only mode logs warnings).
  """
  directory = os.path.join(os.path.abspath(workdir), CHECKPOINTS)
  if options is None:
    options = ocp.CheckpointManagerOptions(create=not read_only, enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options)


def make_meta(cfg: ml_collections.ConfigDict, *, step: int, mean: np.ndarray, std: np.ndarray,
              weights: list[str], source: str = "", **extra: Any) -> dict[str, Any]:
  mean, std = stats.check_stats(mean, std, source="statistics to save")
  return {
      "format": FORMAT,
      "step": int(step),
      "model": cfg.model.to_dict(),
      "config": _json_safe(cfg.to_dict()),
      # float32 -> Python float -> JSON -> float32 round-trips exactly.
      "stats": {"mean": mean.ravel().tolist(), "std": std.ravel().tolist()},
      "weights": sorted(weights),
      "source": source,
      **extra,
  }


def _json_safe(tree):
  if isinstance(tree, dict):
    return {str(k): _json_safe(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_json_safe(v) for v in tree]
  if isinstance(tree, (str, int, float, bool)) or tree is None:
    return tree
  return str(tree)


def save_inference(workdir: str, model: CDEIT, cfg: ml_collections.ConfigDict, *,
                   mean: np.ndarray, std: np.ndarray, step: int = 0, source: str = "",
                   weights: str = "ema") -> str:
  """Save one weight set (`ema` or `raw`) with its metadata; returns the step's directory."""
  if weights not in WEIGHT_ITEMS:
    raise ValueError(f"weights must be one of {sorted(WEIGHT_ITEMS)}, got {weights!r}")
  meta = make_meta(cfg, step=step, mean=mean, std=std, weights=[weights], source=source)
  with manager(workdir) as mngr:
    if step in mngr.all_steps():
      raise FileExistsError(f"{mngr.directory}/{step} exists already: choose another --workdir "
                            "or --step")
    mngr.save(step, args=ocp.args.Composite(**{
        WEIGHT_ITEMS[weights]: ocp.args.StandardSave(weights_of(model)),
        "meta": ocp.args.JsonSave(meta)}))
    mngr.wait_until_finished()
    return str(mngr.directory / str(step))


def resolve(path: str, step: int | None = None) -> tuple[str, int]:
  """(workdir, step) for a workdir, its `checkpoints/` folder, or one `checkpoints/<step>`."""
  path = os.path.abspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint {path}: no such file or directory")
  base = os.path.basename(path)
  if base.isdigit() and os.path.basename(os.path.dirname(path)) == CHECKPOINTS:
    return os.path.dirname(os.path.dirname(path)), int(base)
  if base == CHECKPOINTS:
    path = os.path.dirname(path)
  if not os.path.isdir(os.path.join(path, CHECKPOINTS)):
    raise FileNotFoundError(f"checkpoint {path}: no {CHECKPOINTS}/ folder here (give a workdir "
                            "written by train.py or `python -m cdeit_jax.convert`)")
  with manager(path, read_only=True) as mngr:
    steps = mngr.all_steps()
  if not steps:
    raise FileNotFoundError(f"checkpoint {path}: {CHECKPOINTS}/ holds no finished checkpoint")
  if step is None:
    return path, max(steps)
  if step not in steps:
    raise FileNotFoundError(f"checkpoint {path}: no step {step} (have {sorted(steps)})")
  return path, step


def read_meta(path: str, step: int | None = None) -> dict[str, Any]:
  workdir, step = resolve(path, step)
  with manager(workdir, read_only=True) as mngr:
    try:
      meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax raises several types for unreadable items
      raise ValueError(f"checkpoint {workdir}/{CHECKPOINTS}/{step}: unreadable metadata ({e})") from e
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ValueError(f"checkpoint {workdir}/{CHECKPOINTS}/{step}: not a {FORMAT!r} checkpoint")
  return meta


def model_config(meta: dict[str, Any]) -> ml_collections.ConfigDict:
  """A config whose `model` section is the checkpoint's."""
  cfg = config_lib.default_config()
  cfg.model.update(meta["model"])
  return cfg


def meta_stats(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  return stats.check_stats(np.asarray(meta["stats"]["mean"]), np.asarray(meta["stats"]["std"]),
                           source="checkpoint metadata")


RUNTIME_MODEL_KEYS = ("dtype", "attention_impl", "attention_query_chunk", "remat")


def load_model(path: str, *, weights: str = "ema", step: int | None = None,
               dtype: str | None = None, sharding: jax.sharding.Sharding | None = None,
               **runtime: Any) -> tuple[CDEIT, dict[str, Any]]:
  """Build the checkpoint's model and load one weight set; returns (model, meta).

  `dtype` and `runtime` (attention_impl, attention_query_chunk, remat) override how the model
  computes, not what it is; `sharding` places the weights (default: the first local device;
  data-parallel callers pass a replicated mesh sharding).
  """
  if weights not in WEIGHT_ITEMS:
    raise ValueError(f"--weights must be one of {sorted(WEIGHT_ITEMS)}, got {weights!r}")
  workdir, step = resolve(path, step)
  meta = read_meta(workdir, step)
  if weights not in meta["weights"]:
    raise ValueError(f"checkpoint {workdir}/{CHECKPOINTS}/{step} has no {weights!r} weights "
                     f"(it has {meta['weights']}); pass --weights {meta['weights'][0]}")
  cfg = model_config(meta)
  if dtype is not None:
    cfg.model.dtype = dtype
  for k, v in runtime.items():
    if k not in RUNTIME_MODEL_KEYS:
      raise TypeError(f"load_model: {k!r} is not one of {RUNTIME_MODEL_KEYS}")
    if v is not None:
      cfg.model[k] = v
  abstract = nnx.eval_shape(lambda: CDEIT(**config_lib.model_kwargs(cfg), rngs=nnx.Rngs(0)))
  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  like = nnx.state(abstract, WEIGHTS).to_pure_dict()
  target = _restore_target(_str_keys(like), sharding)
  item = WEIGHT_ITEMS[weights]
  with manager(workdir, read_only=True) as mngr:
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          **{item: ocp.args.StandardRestore(target)}))[item]
    except Exception as e:
      raise ValueError(f"checkpoint {workdir}/{CHECKPOINTS}/{step}: cannot restore {item} into "
                       f"the model its metadata describes ({type(e).__name__}: {e})") from e
  graphdef, state, rest = nnx.split(abstract, WEIGHTS, ...)
  state.replace_by_pure_dict(_restore_keys(restored, like))
  return nnx.merge(graphdef, state, rest), meta


# ----------------------------------------------------------------------------- training


def _single_host_array_writes() -> None:
  """Write replicated arrays from one replica when there is one host.

  orbax's replica-parallel writes split each replicated array over its replicas with many small
  eager slices (19 of 22 s of a 40-step CPU run over 8 devices); they only pay off when the
  replicas sit on different hosts.
  """
  if jax.process_count() == 1:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


def train_manager(workdir: str, *, keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  """Manager for training: keeps the latest `keep` steps plus the one with the lowest
  validation loss (saved with `metrics={"val_loss": ...}`)."""
  from orbax.checkpoint.checkpoint_managers import preservation_policy as pp
  _single_host_array_writes()
  policy = pp.AnyPreservationPolicy([
      pp.LatestN(n=keep),
      pp.BestN(get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
               keep_checkpoints_without_metrics=False)])
  return manager(workdir, options=ocp.CheckpointManagerOptions(
      preservation_policy=policy, enable_async_checkpointing=async_save))


def _weights_target(params_like, fixed_like) -> dict:
  return _str_keys(nnx.merge_state(params_like, fixed_like).to_pure_dict())


def save_train(mngr: ocp.CheckpointManager, state, data_iter, meta: dict[str, Any],
               val_loss: float | None = None) -> None:
  """Save a training state (every process calls this; orbax coordinates the writes)."""
  import grain
  step = int(meta["step"])
  items = {
      "params": ocp.args.StandardSave(_weights_target(state.params, state.fixed)),
      "ema_params": ocp.args.StandardSave(_weights_target(state.ema, state.fixed)),
      "opt_state": ocp.args.StandardSave(state.opt_state),
      "meta": ocp.args.JsonSave(dict(meta, val_loss=val_loss)),
  }
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  mngr.save(step, args=ocp.args.Composite(**items),
            metrics=None if val_loss is None else {"val_loss": float(val_loss)})


def restore_train(mngr: ocp.CheckpointManager, step: int, abstract_state, shardings, data_iter):
  """Restore (state, meta) at `step` onto `shardings` (any device count), and the data iterator."""
  import grain

  w_like = nnx.merge_state(abstract_state.params, abstract_state.fixed)
  w_target = _restore_target(_weights_target(abstract_state.params, abstract_state.fixed),
                             _weights_target(shardings.params, shardings.fixed))
  items = {"params": ocp.args.StandardRestore(w_target),
           "ema_params": ocp.args.StandardRestore(w_target),
           "opt_state": ocp.args.StandardRestore(_restore_target(abstract_state.opt_state,
                                                                 shardings.opt_state)),
           "meta": ocp.args.JsonRestore()}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  try:
    r = mngr.restore(step, args=ocp.args.Composite(**items))
  except ValueError as e:
    raise ValueError(
        f"cannot resume from {mngr.directory}/{step}: its state does not fit this config "
        f"(changed config.model or config.optimizer?); use a new --workdir or the original "
        f"settings. orbax said: {e}") from e

  def split(restored):
    state = jax.tree.map(lambda a: a, w_like)
    state.replace_by_pure_dict(_restore_keys(restored, w_like.to_pure_dict()))
    return nnx.split_state(state, nnx.Param, Fixed)

  params, fixed = split(r["params"])
  ema, _ = split(r["ema_params"])
  state = abstract_state.replace(step=jax.device_put(jax.numpy.int32(r["meta"]["step"]),
                                                     shardings.step),
                                 params=params, fixed=fixed, ema=ema, opt_state=r["opt_state"])
  return state, r["meta"]


def best_step(workdir: str) -> int | None:
  """The kept step with the lowest validation loss (None if none was validated)."""
  workdir, _ = resolve(workdir)
  with manager(workdir, read_only=True) as mngr:
    steps = mngr.all_steps()
  scored = [(m["val_loss"], s) for s in steps
            if (m := read_meta(workdir, s)).get("val_loss") is not None]
  return min(scored)[1] if scored else None
