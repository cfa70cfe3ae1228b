"""Building CDEIT models: from a config (training, compile-only checks, conversion) or from a
checkpoint (evaluation), with the fixed variables recomputed from the config and the
calibration taken from the checkpoint's metadata."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint
from cdeit_jax.checkpoints.checkpoint import CHECKPOINTS, WEIGHT_ITEMS
from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError
from cdeit_jax.common.variables import Fixed
from cdeit_jax.model import condition_kinds, output_kinds
from cdeit_jax.model.network import CDEIT
from cdeit_jax.model.system import MODEL_KEYS, ModelSystem


def resolve(cfg: ml_collections.ConfigDict, meta: dict[str, Any] | None = None) -> ModelSystem:
  """The one resolution of a model's system (`model.system.ModelSystem`, and its one
  constructor) from its config and, for a saved model, its checkpoint's metadata (which keeps
  the device as arrays, `meta["device"]`: the device file may move or change after training).
  Without `meta`, the device is the config's (`config.simulator.layout`, a preset or a device
  file) for a model of any system's values, CDEIT's 16 electrodes for a model of the EIM; either
  way with the config's contact impedance (`config_lib.measuring_system`)."""
  from cdeit_jax.eit import layout

  condition = condition_kinds.of(cfg.model.get("cond", MODEL_KEYS["cond"]))
  output = output_kinds.of(cfg.model.get("output", MODEL_KEYS["output"]))
  removals = str(cfg.simulator.removals or "none") if condition.reads_values else "none"
  layout.removal_sets(removals)  # a bad rule is named now
  if meta is not None:
    kept = layout.Layout.from_record(
      meta.get("device"), f"checkpoint metadata of step {meta.get('step')!r}: device"
    )
  else:
    kept = None if condition.reads_values else layout.preset("cdeit16")
  device = config_lib.measuring_system(cfg.simulator, kept)
  carrying = str(cfg.model.get("current_carrying", MODEL_KEYS["current_carrying"]))
  return ModelSystem(device, removals, condition, output, carrying)


def build(
  cfg: ml_collections.ConfigDict, system: ModelSystem, *, seed: int = 0, platform: str | None = None
) -> CDEIT:
  """`CDEIT(**config.model)` of the resolved `system` (`resolve`), the attention backend
  resolved for `platform`."""
  return CDEIT(**config_lib.model_kwargs(cfg, system, platform), rngs=nnx.Rngs(seed))


def fixed_variables(cfg: ml_collections.ConfigDict, system: ModelSystem, sharding) -> nnx.State:
  """The model's Fixed variables (the physics-informed model's linear operator, uncalibrated;
  empty for the published model) computed from the config and the resolved `system` alone; jit
  drops the unused weight initialisation."""
  make = lambda: nnx.state(build(cfg, system), Fixed)
  return jax.jit(make, out_shardings=sharding)()


def model_config(meta: dict[str, Any]) -> ml_collections.ConfigDict:
  """The checkpoint's config (its measuring system included) with its `model` section; a value
  of the wrong type (an edited file) is a CheckpointError naming it."""
  try:
    cfg = config_lib.from_json(meta.get("config", {}))
    cfg.model.update(meta["model"])
  except (TypeError, ValueError, KeyError, AttributeError) as e:
    raise checkpoint.CheckpointError(
      f"checkpoint metadata of step {meta.get('step')!r}: its config does not fit this "
      f"version's ({' '.join(str(e).split())[:200]}); the file was edited or damaged"
    ) from None
  return cfg


RUNTIME_MODEL_KEYS = ("dtype", "attention_impl", "attention_query_chunk", "remat")
# Model settings that change what the network reads, not its weights: a fine-tuning run may
# differ from its start in them (`initial_params`).
INPUT_ONLY_KEYS = ("current_carrying",)


def load(
  path: str,
  *,
  weights: str = "ema",
  step: int | None = None,
  dtype: str | None = None,
  sharding: jax.sharding.Sharding | None = None,
  **runtime: Any,
) -> tuple[CDEIT, dict[str, Any]]:
  """Build the checkpoint's model and load one weight set; returns (model, meta).

  `dtype` and `runtime` (attention_impl, attention_query_chunk, remat) override how the model
  computes, not what it is; `sharding` places the weights (default: the first local device;
  data-parallel callers pass a replicated mesh sharding).
  """
  workdir, step = checkpoint.resolve(path, step)
  with checkpoint.manager(workdir, read_only=True) as mngr:
    meta = checkpoint.read_meta(workdir, step, mngr=mngr)
    system = resolve(model_config(meta), meta)
    model = load_weights(
      workdir, meta, system, weights=weights, sharding=sharding, mngr=mngr, dtype=dtype, **runtime
    )
  return model, meta


def load_weights(
  workdir: str,
  meta: dict[str, Any],
  system: ModelSystem,
  *,
  weights: str = "ema",
  sharding: jax.sharding.Sharding | None = None,
  mngr=None,
  dtype: str | None = None,
  weights_only: bool = False,
  **runtime: Any,
) -> CDEIT | nnx.State:
  """The model of a step whose metadata `meta` is read already, with one weight set loaded
  (`load`), of the `system` the command resolved (`resolve`); `mngr`: the workdir's open
  CheckpointManager, if the caller holds one.
  `weights_only`: the weight set alone (`nnx.Param` state), the model not built (nothing is
  computed from the config: no physics-informed operator), as an export needs it."""
  if weights not in WEIGHT_ITEMS:
    raise InputError(f"weights must be one of {sorted(WEIGHT_ITEMS)}, got {weights!r}")
  step = int(meta["step"])
  where = f"checkpoint {workdir}/{CHECKPOINTS}/{step}"
  if weights not in meta["weights"]:
    raise InputError(
      f"{where} has no {weights!r} weights (it has {meta['weights']}); pass "
      f"--config.eval.weights={meta['weights'][0]}"
    )
  cfg = model_config(meta)
  if dtype is not None:
    cfg.model.dtype = dtype
  for k, v in runtime.items():
    if k not in RUNTIME_MODEL_KEYS:
      raise TypeError(f"loading.load: {k!r} is not one of {RUNTIME_MODEL_KEYS}")
    if v is not None:
      cfg.model[k] = v
  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  model = nnx.eval_shape(lambda: build(cfg, system))
  restored = checkpoint.restore_item(
    workdir, step, WEIGHT_ITEMS[weights], nnx.state(model, nnx.Param), sharding, mngr=mngr
  )
  if weights_only:
    return restored
  return assemble(cfg, system, restored, meta.get("calibration", {}), sharding, model)


def assemble(
  cfg: ml_collections.ConfigDict,
  system: ModelSystem,
  params: nnx.State,
  calibration: dict[str, list[float]],
  sharding: jax.sharding.Sharding,
  abstract: CDEIT | None = None,
) -> CDEIT:
  """The model of `cfg` and `system` with its trained weights `params`: the fixed variables
  recomputed from the config (placed on `sharding`), the calibration a checkpoint recorded set;
  `abstract`: the model's shapes, if the caller built them already."""
  if abstract is None:
    abstract = nnx.eval_shape(lambda: build(cfg, system))
  graphdef = nnx.split(abstract, nnx.Param, ...)[0]
  model = nnx.merge(graphdef, params, fixed_variables(cfg, system, sharding))
  checkpoint.set_calibration(model, calibration)
  return model


def start_of(path: str) -> dict[str, Any]:
  """The step a fine-tuning starts from (`config.init_from`: a workdir's newest step, or one
  step folder), resolved once, when the fine-tuning starts: {given, workdir, step, sha256
  (`checkpoint.fingerprint`)}. Every step of the run records it (meta["init_from"]), so its start
  is that step, not whichever is newest later (`start_folder`)."""
  workdir, step = checkpoint.resolve(path)
  return {
    "given": path,
    "workdir": fileio.resolve(workdir),
    "step": int(step),
    "sha256": checkpoint.fingerprint(workdir, step),
  }


def start_folder(record: dict[str, Any], where: str) -> tuple[str, int]:
  """(workdir, step) of the start a fine-tuning recorded (`start_of`), checked: an InputError
  naming `where` when that step is gone or is no longer the one trained from."""
  workdir, step = record["workdir"], int(record["step"])
  folder = fileio.join(workdir, CHECKPOINTS, str(step))
  again = "restore that step, or fine-tune again from the start you mean"
  if not fileio.path(folder).is_dir():
    have = checkpoint.all_steps(workdir) if fileio.path(workdir).is_dir() else "nothing"
    raise InputError(
      f"{where}: this run was fine-tuned from step {step} of {workdir} (config.init_from), "
      f"which is gone (that folder holds {have}); it is the step that is used, no other: {again}"
    )
  if checkpoint.fingerprint(workdir, step) != record["sha256"]:
    raise InputError(
      f"{where}: this run was fine-tuned from step {step} of {workdir} (config.init_from), "
      "whose EMA weights or metadata changed since (their SHA-256 is not the one recorded when "
      f"the fine-tuning started); it is the step that is used, as it was: {again}"
    )
  return workdir, step


def initial_params(
  path: str, cfg: ml_collections.ConfigDict, like: nnx.State, sharding
) -> tuple[nnx.State, str]:
  """(the EMA weights of the checkpoint at `path`, placed as `like`, a run's freshly
  initialised params, with `sharding`; one line for the run's log) that start a fine-tuning run
  of `cfg` (`config.init_from`). The checkpoint's model must be `cfg.model` (the settings that
  only say how it computes aside); its measuring system may differ (fine-tuning for a new device).
  A start with fewer inputs (`added_inputs`: condition priors that are a prefix of this model's,
  no removal input where this has one) starts this model with zero weights on what it adds, so
  the run begins as the start's function.
  """
  workdir, step = checkpoint.resolve(path)
  meta = checkpoint.read_meta(workdir, step)
  start = model_config(meta)
  diff = model_differences(start, cfg, aside=INPUT_ONLY_KEYS)
  keep = _condition_channels(start, cfg) if diff else None
  added = added_inputs(start, cfg) if diff and keep is None else None
  if diff and keep is None and added is None:
    raise InputError(
      f"config.init_from={path!r}: its model is not this config's ({diff}); give a checkpoint "
      "of the same model, or change the config's model section to its"
    )
  if "ema" not in meta.get("weights", ()):
    raise InputError(f"config.init_from={path!r}: step {step} has no EMA weights to start from")
  embed = lambda kp: (
    "x_embedder" in jax.tree_util.keystr(kp) and "kernel" in jax.tree_util.keystr(kp)
  )
  stored = like
  if keep is not None or added is not None:  # the start's patch embedding has other channels
    channels = len(keep) + 1 if keep is not None else added["channels"]
    stored = jax.tree_util.tree_map_with_path(
      lambda kp, a: (
        jax.ShapeDtypeStruct((*a.shape[:2], channels, a.shape[3]), a.dtype) if embed(kp) else a
      ),
      like,
    )
  placed = sharding
  if added is not None and added["removal"]:  # the start has no removal vectors
    stored = nnx.State({k: v for k, v in stored.items() if k != "removal_embed"})
    if not isinstance(sharding, jax.sharding.Sharding):
      placed = nnx.State({k: v for k, v in sharding.items() if k != "removal_embed"})
  try:
    params = checkpoint.restore_item(workdir, step, WEIGHT_ITEMS["ema"], stored, placed)
  except InputError as e:
    raise InputError(
      f"config.init_from={path!r}: {e} (a model for another number of values? fine-tuning "
      "needs a checkpoint of a model with this config's measuring system size)"
    ) from None
  line = f"initialised from the EMA weights of {workdir}/{CHECKPOINTS}/{step}"
  if added is not None:
    return _with_added_inputs(params, like, added["channels"]), line + (
      f" (a model with fewer inputs: {added['what']} start at zero)"
    )
  if keep is None:
    return params, line
  if isinstance(sharding, jax.sharding.Sharding):
    sharding = jax.tree.map(lambda _: sharding, params)
  params = jax.tree_util.tree_map_with_path(
    lambda kp, a, s: jax.device_put(a[:, :, keep, :], s) if embed(kp) else a,
    params,
    sharding,
  )
  return params, line + (
    " (a model of CDEIT's EIM and linear images: the patch embedding's EIM channel dropped, "
    "the rest kept)"
  )


def added_inputs(start: ml_collections.ConfigDict, cfg: ml_collections.ConfigDict) -> dict | None:
  """How a model of `cfg` adds to the inputs of its start's model, when it differs from it in
  nothing else: `channels`, the start's patch-embedding input channels (this model's first ones:
  the start's priors are a prefix of `cond_priors`, and channels are prior-major), `removal`,
  whether this model adds the removal input, `what`, in words; else None."""
  keys = set(differing_model_keys(start, cfg, aside=INPUT_ONLY_KEYS))
  if not keys or not keys <= {"cond_priors", "removal_input"}:
    return None
  was, now = start.model, cfg.model
  before = tuple(was.get("cond_priors") or ("noser",))
  after = tuple(now.get("cond_priors") or ("noser",))
  if after[: len(before)] != before or (was.get("removal_input") and not now.get("removal_input")):
    return None
  removal = bool(now.get("removal_input")) and not was.get("removal_input")
  image = output_kinds.of(now.get("output", MODEL_KEYS["output"])).noisy_channels(1)
  what = [f"the channels of priors {after[len(before) :]}"] if len(after) > len(before) else []
  what += ["the removal input"] if removal else []
  return {
    "channels": image + len(before) * len(now.get("cond_alphas") or ()),
    "removal": removal,
    "what": " and ".join(what),
  }


def _with_added_inputs(params: nnx.State, like: nnx.State, channels: int) -> nnx.State:
  """`like` (a fresh model's params) with the start's `params` in place: the start's patch
  embedding in its first `channels` input channels and zeros in the rest, the removal vectors
  (absent from the start) zero."""
  start = params.to_pure_dict()

  def put(kp, a):
    keys = [getattr(k, "key", getattr(k, "idx", None)) for k in kp]
    node = start
    for k in keys:
      if not isinstance(node, dict) or k not in node:
        return jnp.zeros_like(a)  # an input the start does not have
      node = node[k]
    if node.shape != a.shape:  # the patch embedding: the start's channels first
      return jnp.zeros_like(a).at[:, :, :channels, :].set(node)
    return jnp.asarray(node, a.dtype)

  pure = jax.tree_util.tree_map_with_path(put, like.to_pure_dict())
  out = jax.tree.map(lambda x: x, like)
  nnx.replace_by_pure_dict(out, pure)
  return jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), out, like)


def _condition_channels(start: ml_collections.ConfigDict, cfg: ml_collections.ConfigDict):
  """The start's patch-embedding input channels that a model of `cfg` keeps when the two differ
  only in their condition, the start's "eim+linear" and this "linear" at the same levels (a
  model of CDEIT's 16 electrodes starts a model of any device: both see the same kind of linear
  images); else None. Channels: the noisy image (an image model's), the EIM, the levels."""
  was, now = start.model, cfg.model
  if differing_model_keys(start, cfg, aside=INPUT_ONLY_KEYS) != ["cond"]:
    return None
  if not condition_kinds.of(now.get("cond")).keeps_channels_of(condition_kinds.of(was.get("cond"))):
    return None
  image = output_kinds.of(now.get("output", MODEL_KEYS["output"])).noisy_channels(1)
  levels = len(now.get("cond_alphas") or ()) * len(now.get("cond_priors") or ("noser",))
  return np.asarray([*range(image), *range(image + 1, image + 1 + levels)])


def start_inputs(path: str, device) -> tuple[tuple[np.ndarray, np.ndarray], dict] | None:
  """((mean, std), condition calibration) of the checkpoint at `path` (`config.init_from`) when
  it was trained for `device`'s measuring system, else None. A fine-tuning run on the same system
  standardises its voltages and scales its condition as its start did: the start's weights then
  see the inputs they learnt, whatever the new data's own statistics (a drifted or otherwise
  shifted distribution), and the two runs interpolate (`checkpoints.interpolate`). For another
  system the values differ in number and meaning: the new data's statistics are computed."""
  from cdeit_jax.eit import layout

  workdir, step = checkpoint.resolve(path)
  meta = checkpoint.read_meta(workdir, step)
  was = layout.Layout.from_record(meta["device"], f"config.init_from={path!r}: its device")
  if not was.same_system(device):
    return None
  return checkpoint.meta_stats(meta), meta.get("calibration", {})


def differing_model_keys(
  there: ml_collections.ConfigDict, here: ml_collections.ConfigDict, aside: tuple[str, ...] = ()
) -> list[str]:
  """The `model` keys whose values differ between two configs, sorted, the settings that only
  say how the model computes (RUNTIME_MODEL_KEYS) and the keys `aside` aside."""
  was, now = there.model.to_dict(), here.model.to_dict()
  skip = set(RUNTIME_MODEL_KEYS) | set(aside)
  return [
    k
    for k in sorted(set(was) | set(now))
    if k not in skip and _plain(was.get(k)) != _plain(now.get(k))
  ]


def model_differences(
  there: ml_collections.ConfigDict, here: ml_collections.ConfigDict, aside: tuple[str, ...] = ()
) -> str:
  """`differing_model_keys` in words ("model.k: a there, b here; ..."); "" if none."""
  was, now = there.model.to_dict(), here.model.to_dict()
  return "; ".join(
    f"model.{k}: {was.get(k)!r} there, {now.get(k)!r} here"
    for k in differing_model_keys(there, here, aside)
  )


def _plain(v: Any) -> Any:
  """A config value as JSON gives it back (tuples as lists), for comparing."""
  return list(map(_plain, v)) if isinstance(v, (list, tuple)) else v
