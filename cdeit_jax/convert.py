"""Import (and export) PyTorch CDEIT checkpoints, strictly; import cdeit-jax model files.

The name table is derived from the NNX module tree, so every NNX variable has exactly one
reference name and transform; a state dict must match it key for key and shape for shape.

Command line (writes a checkpoint that eval.py, reconstruct, ship and `config.init_from` take):
  python -m cdeit_jax.convert --checkpoint best.pt --config configs/default.py --workdir DIR
  python -m cdeit_jax.convert --checkpoint MODEL.safetensors --workdir DIR
The first reads the authors' best.pt (their EMA weights; torch needed, or an .npz of it made
where torch is: `NPZ_RECIPE`), with the model sizes its shapes give (`sizes_of`) and the rest
from the config. The second imports a model file (`python -m cdeit_jax.export`,
`checkpoints.model_file`), which carries its config, device and statistics: no --config.
"""

from __future__ import annotations

import copy
import json
import math
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx

from cdeit_jax.common import fileio
from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.model.layers import relative_position_index, sincos_pos_embed_2d
from cdeit_jax.model.network import CDEIT

WINDOW_BLOCKS = ("swinIn1", "swinIn2", "swinOut1", "swinOut2")


@dataclass(frozen=True)
class Entry:
  """One reference tensor: the NNX path it fills and the two layout transforms."""

  path: tuple[Any, ...]
  to_nnx: Callable[[np.ndarray], np.ndarray]
  to_torch: Callable[[np.ndarray], np.ndarray]


def _ident(a):
  return a


def _torch_prefix(path: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
  """Reference module prefix of an NNX path, and the rest of the path inside that module."""
  head = path[0]
  if head in ("x_embedder", "final_layer"):
    return {"x_embedder": "x_embedder.proj"}.get(head, head), path[1:]
  if head == "t_fc1":
    return "t_embedder.mlp.0", path[1:]
  if head == "t_fc2":
    return "t_embedder.mlp.2", path[1:]
  if head in WINDOW_BLOCKS or head == "mid":
    return f"blocks.{head}", path[1:]
  if head == "downs":  # Sequential(PatchMerging, Block, Block)
    i, part = path[1], path[2]
    if part == "merge":
      return f"blocks.downs.{i}.0", path[3:]
    return f"blocks.downs.{i}.{path[3] + 1}", path[4:]
  if head == "ups":  # ModuleList(Sequential(rearrange, Upsample, Conv2d), Linear, Block, Block)
    i, part = path[1], path[2]
    if part == "conv":
      return f"blocks.ups.{i}.0.2", path[3:]
    if part == "fuse":
      return f"blocks.ups.{i}.1", path[3:]
    return f"blocks.ups.{i}.{path[3] + 2}", path[4:]
  raise KeyError(f"no reference name for NNX path {path}")


def _torch_inner(rest: tuple[Any, ...], window: bool) -> str:
  names = []
  for k in rest:
    if k == "attn" and window:
      names += ["attn", "attn"]  # the reference wraps WindowAttention in a module named `attn`
    elif k == "adaLN_modulation":
      names.append("adaLN_modulation.1")  # Sequential(SiLU, Linear)
    elif k in ("kernel", "scale"):
      names.append("weight")
    else:
      names.append(str(k))
  return ".".join(names)


def name_table(model: CDEIT) -> tuple[dict[str, Entry], dict[str, np.ndarray]]:
  """Reference name -> Entry for every loadable variable; and the fixed tables to check (the
  sin-cos `pos_embed` and the Swin index buffers), which the model computes itself."""
  if model.conditioner is not None:
    raise InputError(
      "the PyTorch CDEIT has only the published condition: use a model with "
      f"config.model.cond='eim' (this one has {model.system.condition.name!r})"
    )
  table: dict[str, Entry] = {}
  buffers = {"pos_embed": sincos_pos_embed_2d(model.hidden_size, model.grid)[None]}
  state = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(state):
    prefix, rest = _torch_prefix(path)
    window = path[0] in WINDOW_BLOCKS
    name = ".".join(p for p in (prefix, _torch_inner(rest, window)) if p)
    shape = tuple(var.shape)
    if path[0] == "x_embedder" and path[-1] == "kernel":  # conv (kh,kw,in,out) <- (out,in,kh,kw)
      entry = Entry(path, lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1))
    elif path[0] == "ups" and path[2] == "conv" and path[-1] == "kernel":  # 1x1 conv
      entry = Entry(path, lambda a: a[:, :, 0, 0].T, lambda a: a.T[:, :, None, None])
    elif path[-1] == "kernel":  # Linear (in,out) <- (out,in)
      entry = Entry(path, lambda a: a.T, lambda a: a.T)
    elif path[-1] == "g":  # (1,1,C) in the reference
      entry = Entry(path, lambda a, s=shape: a.reshape(s), lambda a: a.reshape(1, 1, -1))
    else:
      entry = Entry(path, _ident, _ident)
    table[name] = entry
    if path[-1] == "relative_position_bias_table":
      win = int(round((np.sqrt(shape[0]) + 1) / 2))
      buffers[name.replace("relative_position_bias_table", "relative_position_index")] = (
        relative_position_index(win)
      )
  return table, buffers


# config.model's sizes in the order they are printed; every one is in a state dict's shapes.
SIZE_KEYS = (
  "image_size",
  "patch_size",
  "in_channels",
  "hidden_size",
  "num_heads",
  "mlp_ratio",
  "num_scales",
  "window_size",
  "freq_dim",
)


def sizes_of(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  """config.model's sizes that reference-named tensor shapes ({name: shape}) give: hidden_size
  and patch_size (the patch conv), in_channels (the final layer's outputs per patch), image_size
  (the position table's tokens), freq_dim (the timestep MLP), num_heads and window_size (a window
  block's relative position table, ((2w-1)^2, heads); every block has the same heads), mlp_ratio
  (an MLP's width), num_scales (the downsampling stages). A size whose tensor is absent or
  malformed is left out; window_size is None where it is the default, a quarter of the grid."""
  get = lambda k, n: tuple(int(d) for d in shapes[k]) if len(shapes.get(k, ())) == n else None
  out: dict[str, Any] = {}
  conv = get("x_embedder.proj.weight", 4)  # (hidden, channels, p, p)
  if conv and conv[2] == conv[3] > 0:
    out["hidden_size"], out["patch_size"] = conv[0], conv[2]
  patch = out.get("patch_size")
  final = get("final_layer.linear.weight", 2)  # (p * p * channels, hidden)
  if final and patch and final[0] % (patch * patch) == 0:
    out["in_channels"] = final[0] // (patch * patch)
  pos, grid = get("pos_embed", 3), None  # (1, grid * grid, hidden)
  if pos and math.isqrt(pos[1]) ** 2 == pos[1]:
    grid = math.isqrt(pos[1])
    if patch:
      out["image_size"] = grid * patch
  table = get(f"blocks.{WINDOW_BLOCKS[0]}.attn.attn.relative_position_bias_table", 2)
  if table and math.isqrt(table[0]) ** 2 == table[0] and math.isqrt(table[0]) % 2:
    out["num_heads"] = table[1]
    window = (math.isqrt(table[0]) + 1) // 2
    out["window_size"] = None if grid and window == grid // 4 else window
  fc1 = get("blocks.mid.mlp.fc1.weight", 2)  # (hidden * mlp_ratio, hidden)
  if fc1 and fc1[1]:
    out["mlp_ratio"] = fc1[0] / fc1[1]
  scales = {k.split(".")[2] for k in shapes if k.startswith("blocks.downs.")}
  if scales or "blocks.mid.mlp.fc1.weight" in shapes:
    out["num_scales"] = len(scales)
  temb = get("t_embedder.mlp.0.weight", 2)  # (hidden, freq_dim)
  if temb:
    out["freq_dim"] = temb[1]
  return {k: out[k] for k in SIZE_KEYS if k in out}


def _shapes(arrays: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  return {k: tuple(np.shape(v)) for k, v in arrays.items()}


def size_differences(
  have: Mapping[str, Any], want: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
  """{key: (have's, want's)} of the sizes in `want` that `have` does not share (a window
  compared as the window it means on `want`'s grid)."""
  out = {}
  for k, v in want.items():
    mine = have.get(k)
    if k == "window_size":  # None: a quarter of the grid, the grid `want`'s once it is set
      grid = want["image_size"] // want["patch_size"] if "image_size" in want else None
      quarter = lambda w, g=grid: g // 4 if w is None and g else w
      same = quarter(mine) == quarter(v)
    elif k == "mlp_ratio":
      same = mine is not None and math.isclose(float(mine), float(v), rel_tol=1e-9)
    else:
      same = mine == v
    if not same:
      out[k] = (mine, v)
  return out


def size_flags(sizes: Mapping[str, Any]) -> str:
  """`sizes` as the command line's flags (--config.model.hidden_size=384 ...)."""
  return " ".join(f"--config.model.{k}={v}" for k, v in sizes.items())


class StateDictMismatch(InputError):
  """A state dict does not match the model; the message lists every problem."""


def _problems(items: list[str], title: str, limit: int = 40) -> list[str]:
  if not items:
    return []
  shown = "\n    ".join(items[:limit])
  more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
  return [f"  {title} ({len(items)}):\n    {shown}{more}"]


def _size_hint(have: dict[str, Any], got: dict[str, Any]) -> str:
  """The last line of a mismatch: the sizes the checkpoint's shapes give, as flags."""
  absent = [k for k in SIZE_KEYS if k not in got]
  unread = f" (its shapes do not give {', '.join(absent)})" if absent else ""
  diff = size_differences(have, got)
  if diff:
    was = ", ".join(f"{k}={mine}" for k, (mine, _) in diff.items())
    return (
      f"  Its shapes give other sizes than this model's ({was}): "
      f"{size_flags({k: v for k, (_, v) in diff.items()})}{unread} (python -m cdeit_jax.convert "
      "takes them from the checkpoint itself)."
    )
  return (
    f"  Its shapes give this model's sizes ({size_flags(got)}){unread}: the keys above differ "
    "otherwise (not a state dict of the published CDEIT's code?)."
  )


def load_torch_state_dict(
  model: CDEIT, state_dict: Mapping[str, Any], *, source: str = "state dict"
) -> CDEIT:
  """Load a reference-named state dict into `model` in place (strict); returns the model.

  Missing, unexpected and mis-shaped keys raise `StateDictMismatch` listing all of them; the
  fixed tables (`pos_embed`, `relative_position_index`) are recomputed and checked, not loaded.
  """
  table, buffers = name_table(model)
  arrays = {
    k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
    for k, v in state_dict.items()
  }
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  missing = sorted(set(table) - set(arrays))
  unexpected = sorted(set(arrays) - set(table) - set(buffers))
  missing += sorted(set(buffers) - set(arrays))
  shapes, bad_buffers, dtypes, nonfinite, updates = [], [], [], [], {}
  for name, entry in table.items():
    if name not in arrays:
      continue
    var = flat[entry.path]
    want = entry.to_torch(np.zeros(var.shape, np.float32)).shape
    got = arrays[name].shape
    if got != want:
      shapes.append(f"{name}: checkpoint {got}, model expects {want}")
      continue
    if arrays[name].dtype.kind != "f":  # ints, bools, complex, strings: not weights
      dtypes.append(f"{name}: {arrays[name].dtype}")
      continue
    if not np.all(np.isfinite(arrays[name])):
      nonfinite.append(
        f"{name}: {int(np.size(arrays[name]) - np.isfinite(arrays[name]).sum())} "
        "NaN or infinite values"
      )
      continue
    updates[entry.path] = entry.to_nnx(arrays[name]).astype(var.dtype)
  for name, want in buffers.items():
    if name in arrays and (
      arrays[name].shape != want.shape or not np.array_equal(arrays[name], want)
    ):
      what = "the sin-cos table" if name == "pos_embed" else "the Swin index of this window size"
      bad_buffers.append(f"{name}: differs from {what}")
  errors = (
    _problems(missing, "missing keys")
    + _problems(unexpected, "unexpected keys")
    + _problems(shapes, "shape mismatches")
    + _problems(bad_buffers, "bad fixed tables")
    + _problems(dtypes, "tensors that are not floating point")
    + _problems(nonfinite, "tensors with non-finite values")
  )
  if errors:
    raise StateDictMismatch(
      f"{source} does not match the CDEIT model (hidden_size={model.hidden_size}, "
      f"image_size={model.image_size}, patch_size={model.patch_size}):\n"
      + "\n".join(errors)
      + "\n"
      + _size_hint(sizes_of(reference_shapes(model)), sizes_of(_shapes(arrays)))
    )
  for path, value in updates.items():
    flat[path].set_value(jax.numpy.asarray(value))
  nnx.update(model, nnx.from_flat_state(flat))
  return model


def reference_shapes(model: CDEIT) -> dict[str, tuple[int, ...]]:
  """{name: shape} of the state dict `export_torch_state_dict` gives, without computing it (an
  abstract model, `nnx.eval_shape`, will do)."""
  table, buffers = name_table(model)
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  shapes = {n: e.to_torch(np.zeros(flat[e.path].shape, np.float32)).shape for n, e in table.items()}
  return {**shapes, **_shapes(buffers)}


def export_torch_state_dict(model: CDEIT) -> dict[str, np.ndarray]:
  """The model's weights under the reference's names and layouts (with the fixed tables)."""
  table, buffers = name_table(model)
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  out = {name: e.to_torch(np.asarray(flat[e.path].get_value())) for name, e in table.items()}
  out.update({k: v if k == "pos_embed" else v.astype(np.int64) for k, v in buffers.items()})
  return out


# What a PyTorch CDEIT checkpoint holds, by who saved it. The authors' main.py saves
# {"model": ema.ema_model.state_dict(), "epoch": N}: its "model" entry is the EMA weights.
# DiT's train.py (which CDEIT's code derives from) saves {"model": the raw weights, "ema": the
# EMA weights, "opt": ..., "args": ...}. A bare state dict, or an .npz of one, is one weight set.
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
NPZ_RECIPE = (
  "python -c \"import sys, torch, numpy as np; c = torch.load(sys.argv[1], map_location='cpu'); "
  "c = c.get('ema', c.get('model', c)); np.savez(sys.argv[2], **{k: (v.float() if "
  'v.is_floating_point() else v).numpy() for k, v in c.items()})" best.pt best.npz'
)


def _is_tensor(v) -> bool:
  return hasattr(v, "detach") or isinstance(v, np.ndarray)


def select_weights(obj: Any, weights: str, path: str) -> tuple[Mapping[str, Any], str]:
  """The state dict of weight set `weights` ("ema" or "raw") in a loaded checkpoint `obj`, and
  the entry it came from, in words.

  A file holding both sets ("ema" and "model", DiT's layout) gives the one asked for; a file
  holding one (the authors' {"model": EMA weights}, a bare state dict) gives it, recorded as the
  set asked for. Prefixes a wrapper adds are taken off: "module." (DistributedDataParallel) and
  "ema_model." / "online_model." (an `ema_pytorch.EMA`'s own state dict)."""
  if not isinstance(obj, Mapping):
    raise InputError(
      f"{path}: expected a state dict or a dict with a 'model' state dict, got {type(obj).__name__}"
    )
  entry = ""
  if isinstance(obj.get("ema"), Mapping):
    if weights == "ema":
      obj, entry = obj["ema"], "its 'ema' entry (the EMA weights)"
    elif isinstance(obj.get("model"), Mapping):
      obj, entry = obj["model"], "its 'model' entry (the raw weights; 'ema' holds the EMA)"
    else:
      raise InputError(f"{path}: holds 'ema' weights but no raw 'model' ones; leave --weights out")
  elif isinstance(obj.get("model"), Mapping):
    obj = obj["model"]
    entry = "its 'model' entry" + (
      " (the EMA weights, as the authors' main.py saves them)" if weights == "ema" else ""
    )
  keys = [k for k in obj if isinstance(k, str)]
  if keys and all(k.startswith("module.") for k in keys):
    obj = {k[len("module.") :]: v for k, v in obj.items()}
  if any(isinstance(k, str) and k.startswith("ema_model.") for k in obj):  # ema_pytorch.EMA
    prefix = {"ema": "ema_model.", "raw": "online_model."}[weights]
    sub = {k[len(prefix) :]: v for k, v in obj.items() if k.startswith(prefix)}
    if not sub:
      raise InputError(
        f"{path}: an ema_pytorch EMA's state dict without its {prefix[:-1]!r}; use --weights ema"
      )
    obj, entry = sub, f"{entry + ', ' if entry else ''}its {prefix[:-1]!r} weights"
  for k, v in obj.items():
    if not _is_tensor(v):
      raise InputError(f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor")
  return obj, entry or "its state dict"


def read_checkpoint(path: str, weights: str = "ema") -> tuple[dict[str, np.ndarray], str]:
  """A reference checkpoint's state dict of weight set `weights` as numpy arrays (float tensors
  of any precision as float32), and where in the file it came from, in words: a `.pt`/`.pth`
  as `torch.save` wrote it (needs torch; `select_weights` says which entry), or an `.npz` of a
  state dict's arrays (no torch: `NPZ_RECIPE` makes one)."""
  if weights not in ("ema", "raw"):
    raise InputError(f"--weights {weights!r}: give ema or raw")
  if not fileio.path(path).exists():
    raise MissingFile(f"--checkpoint {path}: no such file")
  if path.endswith(".npz"):
    try:
      obj = fileio.load_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
      raise InputError(f"{path}: not a readable .npz of arrays ({e})") from e
  else:
    obj = _torch_load(path)
  state_dict, entry = select_weights(obj, weights, path)
  out = {}
  for k, v in state_dict.items():
    if hasattr(v, "detach"):
      v = v.detach().cpu()
      v = v.float() if v.is_floating_point() else v  # bfloat16 has no numpy type
      v = v.numpy()
    out[k] = np.asarray(v)
  return out, entry


def read_state_dict(path: str, weights: str = "ema") -> dict[str, np.ndarray]:
  """A reference checkpoint's state dict (`read_checkpoint`) as numpy arrays."""
  return read_checkpoint(path, weights)[0]


def _torch_load(path: str) -> Any:
  """What `torch.save` wrote to `path`, loaded with torch without running pickled code."""
  with fileio.open_binary(path) as fh:
    head = fh.read(2)
  if head != b"PK" and head[:1] != b"\x80":  # torch.save: a zip archive, or (torch < 1.6) a pickle
    raise InputError(
      f"{path}: not a PyTorch checkpoint (neither a zip archive nor a pickle); "
      "give the checkpoint that torch.save wrote, or an .npz of its arrays"
    )
  try:
    import torch
  except ImportError:
    raise InputError(
      f"reading {path} needs PyTorch: pip install 'cdeit-jax[torch]' (on a machine without an "
      f"NVIDIA GPU first `{CPU_TORCH}`, or pip takes the CUDA build, GBs); or make an .npz of "
      f"it where torch is, `{NPZ_RECIPE}`, and give that"
    ) from None
  import argparse
  import contextlib

  # DiT's train.py saves its argparse.Namespace beside the weights: allowed, nothing else.
  allow = getattr(torch.serialization, "safe_globals", None)
  scope = allow([argparse.Namespace]) if allow else contextlib.nullcontext()
  try:
    with fileio.open_binary(path) as fh, scope:  # weights_only: no arbitrary unpickling
      return torch.load(fh, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises several types for corrupt or unsafe files
    raise InputError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {e})") from e


def fit_sizes(cfg, state_dict: Mapping[str, Any], source: str) -> tuple[Any, str]:
  """`cfg` with config.model's sizes set to those `state_dict`'s shapes give (`sizes_of`: they
  are fixed by the weights, so a config saying otherwise cannot load them), and one line naming
  those changed ('' when none; `cfg` itself is not changed)."""
  have = {k: cfg.model.get(k) for k in SIZE_KEYS}
  diff = size_differences(have, sizes_of(_shapes(state_dict)))
  if not diff:
    return cfg, ""
  cfg = copy.deepcopy(cfg)
  for k, (_, v) in diff.items():
    cfg.model[k] = v
  said = ", ".join(f"{k}={v} (the config's {mine})" for k, (mine, v) in diff.items())
  return cfg, f"{source}: model sizes from its shapes: {said}"


def convert(
  checkpoint_path: str,
  cfg,
  workdir: str,
  *,
  stats_dir: str | None = None,
  step: int = 0,
  weights: str = "ema",
) -> str:
  """Read a reference checkpoint (`read_checkpoint`: weight set `weights`), load it strictly into
  the config's model with the sizes the checkpoint's shapes give (`fit_sizes`), save a workdir;
  prints which entry of the file it read and the sizes it took from it."""
  from cdeit_jax.checkpoints import checkpoint, loading
  from cdeit_jax.data import stats

  state_dict, entry = read_checkpoint(checkpoint_path, weights)
  print(f"{checkpoint_path}: read {entry}, imported as the {weights!r} weights")
  cfg, note = fit_sizes(cfg, state_dict, checkpoint_path)
  if note:
    print(note)
  model = loading.build(cfg, loading.resolve(cfg))
  load_torch_state_dict(model, state_dict, source=f"{checkpoint_path} ({entry})")
  mean, std = stats.load_stats(stats_dir) if stats_dir else stats.authors_stats()
  return checkpoint.save_inference(
    workdir,
    model,
    cfg,
    mean=mean,
    std=std,
    step=step,
    weights=weights,
    source=fileio.resolve(checkpoint_path),
  )


@dataclass(frozen=True)
class ModelFile:
  """A model file checked whole (`check_model_file`): its model assembled and what its step is
  saved with."""

  model: CDEIT
  cfg: Any
  meta: dict[str, Any]
  mean: np.ndarray
  std: np.ndarray
  files: dict[str, str]  # {name: text} for the step folder (the uncertainty scale)
  extra: dict[str, Any]  # more fields of its metadata: the file's digest, its training record
  source: str


def check_model_file(path: str) -> ModelFile:
  """Everything a model file says, checked before anything is written (`import_model_file`):
  the file whole (`model_file.read`: format, digest, float32 finite weights), its record (the
  step's metadata as a checkpoint's is checked, statistics, calibration, uncertainty scale,
  training record), the sizes its config implies (`network.check_sizes`, before anything is
  allocated) and its weights' names and shapes against the model it describes; a
  `ModelFileError` in one line naming the file, else the model, assembled."""
  from cdeit_jax.checkpoints import checkpoint, loading, model_file
  from cdeit_jax.infer import intervals, run_opening

  arrays, record, sha = model_file.read(path)
  meta, where = record["meta"], f"model file {path}"
  step = meta.get("step")
  whole = isinstance(step, int) and not isinstance(step, bool) and step >= 0
  problem = checkpoint.meta_problem(meta, step) if whole else f"step {step!r}"
  if problem:
    raise model_file.ModelFileError(f"{where}: its metadata is not a checkpoint's ({problem})")
  for key in ("training", "exported"):
    if not isinstance(record.get(key) or {}, dict):
      raise model_file.ModelFileError(f"{where}: its record's {key!r} is not a mapping")
  files = {}
  text = record.get("uncertainty")
  if text is not None:  # the step's calibration file's text, as `intervals.read` reads it
    try:
      intervals.from_record(json.loads(text) if isinstance(text, str) else None, where)
    except (ValueError, InputError):
      raise model_file.ModelFileError(
        f"{where}: its record's uncertainty is not a calibration export writes (JSON text of "
        f"a positive 'scale', got {text!r:.80}); export the run again"
      ) from None
    files[run_opening.UNCERTAINTY_FILE] = text
  try:
    mean, std = checkpoint.meta_stats(meta)
    cfg = loading.model_config(meta)
    system = loading.resolve(cfg, meta)
    abstract = nnx.eval_shape(lambda: loading.build(cfg, system))  # sizes checked first
  except InputError as e:
    raise model_file.ModelFileError(f"{where}: its record does not describe a model: {e}") from None
  names = {
    "/".join(map(str, p)): (p, v) for p, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))
  }
  missing, unexpected = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
  shapes = [
    f"{n}: file {arrays[n].shape}, model {v.shape}"
    for n, (p, v) in names.items()
    if n in arrays and arrays[n].shape != v.shape
  ]
  errors = (
    _problems(missing, "missing weights")
    + _problems(unexpected, "unexpected weights")
    + _problems(shapes, "shape mismatches")
  )
  if errors:
    raise model_file.ModelFileError(
      f"{where}: its weights do not fit the model its config describes:\n" + "\n".join(errors)
    )
  params = nnx.from_flat_state(
    [(p, v.replace(value=jax.numpy.asarray(arrays[n], v.dtype))) for n, (p, v) in names.items()]
  )
  sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  try:
    model = loading.assemble(cfg, system, params, meta.get("calibration", {}), sharding, abstract)
  except InputError as e:
    raise model_file.ModelFileError(f"{where}: its calibration: {e}") from None
  training = {"training": record["training"]} if record.get("training") else {}
  came = (record.get("exported") or {}).get("from", "")
  return ModelFile(
    model,
    cfg,
    meta,
    mean,
    std,
    files,
    {"model_file": {"sha256": sha}, **training},
    f"{where} (sha256 {sha[:16]}...; {came})",
  )


def import_model_file(path: str, workdir: str) -> str:
  """A model file (`checkpoints.model_file`) as an inference checkpoint in `workdir`, whole or
  not at all: checked whole first (`check_model_file`), then its EMA weights, metadata, training
  record and uncertainty scale saved as the workdir's one step (`checkpoint.save_inference`,
  which refuses a workdir holding a model or a run); returns the step's directory."""
  from cdeit_jax.checkpoints import checkpoint

  checkpoint.refuse_import(workdir)  # before the work
  got = check_model_file(path)
  return checkpoint.save_inference(
    workdir,
    got.model,
    got.cfg,
    mean=got.mean,
    std=got.std,
    step=int(got.meta["step"]),
    source=got.source,
    extra=got.extra,
    files=got.files,
  )


def main(argv: list[str]) -> None:
  from absl import flags

  del argv
  f = flags.FLAGS
  given = [n for n in ("config", "stats", "step", "weights") if f[n].present]
  write_workdir(
    f.checkpoint, f.workdir, config=f.config, stats=f.stats, step=f.step, weights=f.weights,
    given=given,
  )  # fmt: skip


def write_workdir(
  checkpoint_path: str,
  workdir: str,
  *,
  config: Any,
  stats: str | None,
  step: int,
  weights: str,
  given: list[str],
) -> None:
  """`workdir` made from a model file or a PyTorch checkpoint (`config`'s model, `stats`, `step`,
  `weights`; `given`: those of them the command line gave, which a model file carries itself)."""
  from cdeit_jax.checkpoints import checkpoint, model_file, shipped

  shipped.refuse_write(workdir, "--workdir")
  fileio.refuse_own_input(workdir, "--workdir", [("--checkpoint", checkpoint_path)])
  checkpoint.refuse_import(workdir)  # a file, a run, a model there: before any work
  if fileio.path(checkpoint_path).is_dir():
    raise InputError(
      f"--checkpoint {checkpoint_path}: is a folder; give a model file ({model_file.SUFFIX}, "
      "python -m cdeit_jax.export) or a PyTorch checkpoint file (.pt, .pth, .npz); a workdir is "
      "read as it is (eval.py --workdir, reconstruct --workdir)"
    )
  if model_file.is_model_file(checkpoint_path) or checkpoint_path.endswith(model_file.SUFFIX):
    if given:
      raise InputError(
        f"--{given[0]}: {checkpoint_path} is a model file, which carries its config, statistics, "
        "step and weights; leave --config, --stats, --step and --weights out"
      )
    path = import_model_file(checkpoint_path, workdir)
  else:
    if config is None:
      raise InputError(
        f"--config: {checkpoint_path} is a PyTorch checkpoint; give the config whose model section "
        "matches it (e.g. --config configs/default.py)"
      )
    path = convert(checkpoint_path, config, workdir, stats_dir=stats, step=step, weights=weights)
  step = int(fileio.basename(path))
  assert checkpoint.resolve(workdir)[1] == step  # the only step (`refuse_import`): the one read
  print(f"wrote {path} (step {step}: what eval.py and reconstruct read with --workdir {workdir})")


if __name__ == "__main__":
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file(
    "config",
    None,
    "config of a PyTorch checkpoint's model (configs/default.py: the published one); its "
    "sizes (hidden_size, num_heads, ...) are taken from the checkpoint's shapes",
    lock_config=True,
  )
  flags.DEFINE_string(
    "checkpoint",
    None,
    "the authors' best.pt (its 'model': their EMA weights), DiT's layout ('model' and 'ema'), a "
    "bare state dict, an .npz of one (no torch needed), or a cdeit-jax model file "
    "(python -m cdeit_jax.export; no --config then)",
  )
  flags.DEFINE_string("workdir", None, "output directory, loadable by eval.py --workdir")
  flags.DEFINE_string(
    "stats",
    None,
    "folder with mean/std (.npy or .pth) the model was trained "
    "with; default: the CDEIT authors' statistics shipped with cdeit-jax",
  )
  flags.DEFINE_integer("step", 0, "step number to record", lower_bound=0)
  flags.DEFINE_enum(
    "weights",
    "ema",
    ["ema", "raw"],
    "the weight set to import: from a file holding both ('ema' and 'model', DiT's layout) that "
    "entry; a file holding one (the authors' best.pt, whose 'model' holds their EMA weights; a "
    "state dict; an .npz) is imported as this set",
  )
  flags.mark_flags_as_required(["checkpoint", "workdir"])
  from cdeit_jax import cli

  cli.run(main)  # one-line reports of our own errors (a state dict that does not match, ...)
