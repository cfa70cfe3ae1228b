"""Reconstruct a test set with a trained or imported CDEIT: sharded sampling, metrics, outputs.

Each example's noise comes from fold_in(fold_in(key(seed), sample), example index), so the
reconstructions do not depend on the batch size or the number of devices or hosts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from tqdm import tqdm

from cdeit_jax import aot, checkpoint, config_lib, data, fileio, logs, metrics, pipeline
from cdeit_jax import training
from cdeit_jax import files as npz_files
from cdeit_jax.eit.phantom import disk_mask  # noqa: F401  (the grid's disk, for figures)
from cdeit_jax import sharding as shd
from cdeit_jax.diffusion import Diffusion
from cdeit_jax.errors import InputError

log = logs.log.getChild("eval")


# Everything an evaluation writes into its output folder (metrics.json last: it marks a complete
# evaluation). Each is written atomically, and all of them are removed first, so an output
# folder never holds one evaluation's figure beside another's metrics.
OUTPUTS = ("reconstructions.png", "predictions.mat", "predictions.npz", "metrics.csv",
           "metrics.json")


def check_out(out: str) -> None:
  """Fail before any work when `out` cannot take the outputs (a file, read-only, ...)."""
  folder = fileio.path(out)
  if folder.exists() and not folder.is_dir():
    raise InputError(f"--out {out}: exists and is not a folder; give a folder path")
  try:
    fileio.makedirs(out)
    probe = folder / f".write-test-{os.getpid()}"
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    raise InputError(f"--out {out}: cannot write there ({e.strerror or e}); give a writable "
                     "folder") from (None if not fileio.is_remote(out) else e)


def check_scale(src, preset: str, limit: int = 8) -> None:
  """Refuse data whose standardised voltages are far off the statistics' scale: the files were
  made with other voltage/current units than the preset says (e.g. tank data as `simulated`)."""
  n = min(len(src), limit)
  v = np.concatenate([np.ravel(src[i]["voltages"]) for i in range(n)])
  typical = float(np.median(np.abs(v)))
  if not typical < 100:
    raise InputError(
        f"{src.path}: its voltages, standardised for preset {preset!r}, are ~{typical:.3g} "
        "standard deviations from the training mean (expected a few): the files are in other "
        "units than this preset; give the preset they were made with (--data uef2017, ktc2023, "
        "simulated) or --voltage-ratio/--current-ratio")


def _json_clean(tree):
  """NaN and infinities as null: metrics.json stays valid JSON."""
  if isinstance(tree, dict):
    return {k: _json_clean(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_json_clean(v) for v in tree]
  if isinstance(tree, (float, np.floating)):
    return float(tree) if np.isfinite(tree) else None
  if isinstance(tree, np.integer):
    return int(tree)
  return tree


# What eval.py may set; everything else (model, data, diffusion) is the checkpoint's.
SETTABLE = ("sampling.", "eval.", *(f"model.{k}" for k in checkpoint.RUNTIME_MODEL_KEYS))


def settings(meta: dict[str, Any], overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The checkpoint's config with `overrides` (dotted keys) applied and the evaluation settings
  checked; errors name `--config.<key>`."""
  for key in overrides:
    if not key.startswith(SETTABLE):
      raise InputError(f"--config.{key}: evaluation takes the model, data and training settings "
                       "from the checkpoint; only config.sampling.*, config.eval.* and "
                       f"config.model.{{{','.join(checkpoint.RUNTIME_MODEL_KEYS)}}} can be set")
  cfg = config_lib.from_json(meta.get("config", {}))
  cfg.model.update(meta["model"])
  config_lib.override(cfg, overrides)
  s, e = cfg.sampling, cfg.eval

  def need(ok: bool, key: str, msg: str) -> None:
    if not ok:
      section, leaf = key.split(".")
      raise InputError(f"--config.{key}={cfg[section][leaf]!r}: {msg}")

  need(s.steps >= 1, "sampling.steps", "must be >= 1")
  need(s.num_samples >= 1, "sampling.num_samples", "must be >= 1")
  need(s.data_consistency >= 0, "sampling.data_consistency", "must be >= 0 (0 = off)")
  need(s.data_consistency_alpha > 0, "sampling.data_consistency_alpha", "must be > 0")
  need(e.max_examples is None or e.max_examples >= 1, "eval.max_examples", "must be >= 1")
  need(e.weights in checkpoint.WEIGHT_ITEMS, "eval.weights",
       f"must be one of {sorted(checkpoint.WEIGHT_ITEMS)}")
  return cfg


def make_sampler(graphdef, diffusion: Diffusion, steps: int, eta: float, shape, mesh,
                 correction_graphdef=None):
  """One compiled sampler: (weights, cond, example indices, key) -> images, batch-sharded.

  With `correction_graphdef` (of a `conditioning.DataConsistency`), `weights` is the pair
  (model state, correction state) and every step's x0 is made consistent with the data."""

  def sample(weights, cond, index, key):
    correct = None
    if correction_graphdef is not None:
      weights, correction = weights
      correct = nnx.merge(correction_graphdef, correction)
    model = nnx.merge(graphdef, weights)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
    return diffusion.sample_fn(model, cond, steps=steps, eta=eta, key=keys, shape=shape,
                               correct=correct)

  b = shd.batch_sharded(mesh)
  return jax.jit(sample, in_shardings=(shd.replicated(mesh), b, b, shd.replicated(mesh)),
                 out_shardings=b)


def memory_budget(device: jax.Device) -> tuple[int | None, int]:
  """(bytes one device's program may use, how many local devices share that memory).

  Accelerators: the device's own memory limit. CPU: the host's available memory, shared by every
  local (fake) device. None where neither is known."""
  stats = {}
  try:
    stats = device.memory_stats() or {}
  except Exception:  # backends without memory statistics
    pass
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0)), 1
  try:
    with open("/proc/meminfo") as fh:
      info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
    return info["MemAvailable"], jax.local_device_count()
  except (OSError, KeyError, ValueError):
    return None, 1


def compile_sampler(sampler, weights, mesh, num_examples: int, batch_size: int | None = None, *,
                    cond_size: int = 16, fraction: float = 0.8):
  """Compile `sampler` for the largest batch that fits the devices; returns (executable, batch).

  `batch_size` (global) is taken as given. Otherwise per-device batches 8, 4, 2, 1 (never more
  than the examples need) are compiled in turn until the compiler's memory analysis says the
  program fits `fraction` of the memory budget (`memory_budget`)."""
  import jax.numpy as jnp
  n = mesh.devices.size
  if batch_size is not None:
    if batch_size < 1 or batch_size % n:
      raise InputError(f"--config.sampling.batch_size={batch_size}: must be a positive multiple "
                       f"of the {n} devices")
    candidates = [batch_size // n]
  else:
    most = max(1, -(-num_examples // n))
    candidates = sorted({min(b, most) for b in (8, 4, 2, 1)}, reverse=True)
  budget, sharing = memory_budget(jax.local_devices()[0])
  key = jax.eval_shape(lambda: jax.random.key(0))
  compiled = None
  for per_device in candidates:
    g = per_device * n
    cond = jax.ShapeDtypeStruct((g, cond_size, cond_size, 1), jnp.float32)
    index = jax.ShapeDtypeStruct((g,), jnp.int32)
    try:
      with jax.set_mesh(mesh):
        compiled = sampler.lower(weights, cond, index, key).compile()
    except jax.errors.JaxRuntimeError as e:  # the compiler itself refuses what cannot fit (TPU)
      if batch_size is not None or per_device == 1 or not aot.is_out_of_memory(e):
        raise
      log.info(f"sampler: batch {g} does not fit ({str(e).splitlines()[0][:120]}); trying smaller")
      continue
    need = training.memory_of(compiled).get("peak_bytes")
    if batch_size is not None or need is None or budget is None or \
        need * sharing <= fraction * budget:
      return compiled, g
    log.info(f"sampler: batch {g} needs ~{need * sharing / 2 ** 30:.1f} GiB of "
             f"{budget / 2 ** 30:.1f} GiB available; trying a smaller batch")
  log.warning(f"sampler: even batch {n} may not fit the available memory; trying it anyway")
  return compiled, n


def _gather(x: jax.Array) -> np.ndarray:
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def evaluate(path: str, data_name: str, data_path: str, out: str,
             overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """Reconstruct the npz files of `data_path` (preset `data_name`) with the checkpoint at `path`
  (a run: its best validated step that loads, else the latest; or one `RUN/checkpoints/STEP`)
  and write every output into `out`; returns metrics.json's content.

  `overrides` (dotted keys, as `--config.sampling.steps=2` gives them) change the sampling and
  evaluation settings and the model's runtime keys of the checkpoint's config."""
  overrides = dict(overrides or {})
  settings({"model": {}}, overrides)  # bad keys and values fail before any work
  if jax.process_index() == 0:
    check_out(out)
    logs.debug_log(out)
  skipped: dict[int, str] = {}  # damaged steps passed over, reported once the choice is made
  step_arg = overrides.get("eval.step")
  workdir, resolved = checkpoint.resolve(path, step_arg)
  if step_arg is not None or fileio.basename(path).isdigit():
    step, meta = resolved, checkpoint.read_meta(workdir, resolved)
    candidates = [step]
  else:
    ranked = checkpoint.ranked_steps(workdir)
    candidates = ranked + [st for st in checkpoint.all_steps(workdir)[::-1] if st not in ranked]
    step, meta = checkpoint.first_readable(workdir, candidates, skipped)
  cfg = settings(meta, overrides)
  s, e = cfg.sampling, cfg.eval
  voltage_ratio, current_ratio = npz_files.resolve_ratios(data_name, e.voltage_ratio,
                                                          e.current_ratio)
  src = data.NpzSource(data_path, data_name, e.stats, voltage_ratio=voltage_ratio,
                       current_ratio=current_ratio, checkpoint_stats=checkpoint.meta_stats(meta),
                       baselines=True, skip_bad=e.skip_bad_files, cache=True)
  n_total = len(src) if e.max_examples is None else min(len(src), e.max_examples)
  check_scale(src, data_name)
  runtime = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("model.")}

  mesh = shd.make_mesh()
  with logs.StderrCapture() as capture:  # a failed restore's TensorStore noise -> debug log
    while True:  # the chosen step, or (damaged weights) the next candidate
      try:
        model, meta = checkpoint.load_model(workdir, weights=e.weights, step=step,
                                            sharding=shd.replicated(mesh), **runtime)
        break
      except checkpoint.CheckpointError as err:
        capture.failed = True
        rest = candidates[candidates.index(step) + 1:]
        if not rest:
          raise
        skipped[step] = str(err)
        step, meta = checkpoint.first_readable(workdir, rest, skipped)
  for bad, reason in skipped.items():
    log.warning(f"skipping checkpoint step {bad}: {reason}")
  if model.conditioner is not None and not (
      np.allclose(model.conditioner.voltage_mean[...], src.mean.ravel(), rtol=1e-6, atol=0) and
      np.allclose(model.conditioner.voltage_std[...], src.std.ravel(), rtol=1e-6, atol=0)):
    log.warning(f"{data_path} is standardised with other statistics than this physics-"
                "informed model was trained with, so its linear input channels are computed "
                "from wrong voltages; use the checkpoint's statistics (no --config.eval.stats, "
                "and no mean/std in the data folder's parent)")
  graphdef, weights = nnx.split(model)
  diffusion = Diffusion(**cfg.diffusion)
  shape = (model.image_size, model.image_size, model.in_channels)
  correction_graphdef = None
  if s.data_consistency:
    from cdeit_jax import conditioning
    dc = conditioning.DataConsistency(src.mean, src.std, strength=s.data_consistency,
                                      alpha=s.data_consistency_alpha)
    correction_graphdef, dc_state = nnx.split(dc)
    weights = (weights, jax.device_put(dc_state, shd.replicated(mesh)))
  sampler = make_sampler(graphdef, diffusion, s.steps, s.eta, shape, mesh, correction_graphdef)
  t0 = time.perf_counter()
  sampler, global_batch = compile_sampler(sampler, weights, mesh, n_total, s.batch_size,
                                          cond_size=model.cond_size)
  compile_s = time.perf_counter() - t0
  batches = list(pipeline.eval_batches(src, global_batch, keys=("cond",), limit=n_total))
  key = jax.random.key(s.seed)

  samples = np.zeros((s.num_samples, n_total, *shape), np.float32)
  t0 = time.perf_counter()
  done = 0
  bar = tqdm(total=n_total * s.num_samples, desc="sampling", unit="image", file=sys.stderr,
             disable=jax.process_index() != 0, mininterval=1.0)
  for k in range(s.num_samples):
    key_k = jax.random.fold_in(key, k)
    for b in batches:
      g = pipeline.to_global(b, mesh)
      imgs = _gather(sampler(weights, g["cond"], g["index"], key_k))
      idx, mask = _gather(g["index"]), _gather(g["mask"]) > 0
      samples[k, idx[mask]] = imgs[mask]
      done += int(mask.sum())
      bar.update(int(mask.sum()))
  sample_s = time.perf_counter() - t0
  bar.close()
  result = {"images_per_s": done / sample_s, "ms_per_image": 1000 * sample_s / done,
            "compile_s": compile_s, "devices": jax.device_count(),
            "processes": jax.process_count(), "global_batch": global_batch}
  if jax.process_index() != 0:
    return result

  pred = samples.mean(0)
  std = samples.std(0) if s.num_samples > 1 else None
  examples = [src[i] for i in range(n_total)]  # cached: each file was read once
  target = np.stack([e["target"] for e in examples])
  names = [src.files[i] for i in range(n_total)]
  overall, rows = metrics.summary(pred[..., 0], target[..., 0])
  empty = metrics.summary(np.zeros_like(pred[..., 0]), target[..., 0])[0]
  report = {"cdeit": overall, "empty": {k: v for k, v in empty.items() if k != "cc"}}  # CC: undefined
  stored = {k: np.stack([e[k] for e in examples])[..., 0] for k in npz_files.BASELINE_KEYS}
  if e.tikhonov:
    from cdeit_jax import eit
    ys = np.stack([e["ys"] for e in examples])  # ys / voltage_ratio
    stored = {"tikhonov": eit.default_tikhonov()(ys), **stored}
  baselines = {}
  for key_b, imgs in stored.items():
    if np.all(np.isfinite(imgs)):
      scaled = np.stack([metrics.scale_baseline(b) for b in imgs])
      baselines[key_b] = scaled
      b_overall, b_rows = metrics.summary(scaled, target[..., 0])
      report[key_b] = b_overall
      for r, br in zip(rows, b_rows):
        r.update({f"{key_b}_{m}": v for m, v in br.items()})
  result.update({
      "metrics": report, "definitions": metrics.DEFINITIONS,
      "settings": {"checkpoint": workdir, "checkpoint_step": int(meta["step"]),
                   "weights": e.weights, "data": data_name,
                   "data_path": fileio.resolve(data_path),
                   "voltage_ratio": voltage_ratio, "current_ratio": current_ratio,
                   "sampling_steps": s.steps, "eta": s.eta,
                   "data_consistency": s.data_consistency,
                   "data_consistency_alpha": s.data_consistency_alpha,
                   "num_samples": s.num_samples, "seed": s.seed, "examples": n_total,
                   "model": meta["model"], "dtype": cfg.model.dtype,
                   "config": {"sampling": s.to_dict(), "eval": e.to_dict(),
                              "overrides": overrides}},
  })
  write_outputs(out, result, rows, names, pred, target, std, samples, baselines,
                current_ratio / voltage_ratio, e.figure)
  return result


def write_outputs(out: str, result: dict, rows: list[dict], names: list[str], pred: np.ndarray,
                  target: np.ndarray, std: np.ndarray | None, samples: np.ndarray,
                  baselines: dict[str, np.ndarray], mat_scale: float, figure: bool) -> None:
  import scipy.io

  fileio.makedirs(out)
  for name in reversed(OUTPUTS):  # an earlier evaluation's outputs go, metrics.json first
    fileio.path(fileio.join(out, name)).unlink(missing_ok=True)

  def write_csv(p):
    with open(p, "w", newline="") as fh:
      w = csv.DictWriter(fh, fieldnames=["name", *rows[0].keys()])
      w.writeheader()
      for name, r in zip(names, rows):
        w.writerow({"name": name, **r})

  fileio.atomic_write(fileio.join(out, "metrics.csv"), write_csv)
  arrays = {"pred": pred, "target": target, "names": np.asarray(names)}
  if std is not None:
    arrays.update(std=std, samples=samples)

  def write_npz(p):
    with open(p, "wb") as fh:
      np.savez(fh, **arrays)

  fileio.atomic_write(fileio.join(out, "predictions.npz"), write_npz)
  mat = {"pred": (pred[..., 0] * mat_scale).astype(np.float64),
         "target": target[..., 0].astype(np.float64), "names": np.asarray(names, dtype=object),
         "scale": mat_scale}
  if std is not None:
    mat["std"] = (std[..., 0] * abs(mat_scale)).astype(np.float64)
  fileio.atomic_write(fileio.join(out, "predictions.mat"),
                      lambda p: scipy.io.savemat(p, mat, do_compression=True))
  if figure:
    fileio.atomic_write(fileio.join(out, "reconstructions.png"),
                        lambda p: save_figure(p, names, target, pred, std, baselines))
  fileio.write_text(fileio.join(out, "metrics.json"),
                    json.dumps(_json_clean(result), indent=2, allow_nan=False))


def save_figure(path: str, names, target, pred, std, baselines, max_rows: int = 32) -> None:
  """Ground truth | reconstruction | uncertainty | baselines per image, electrode 0 on top."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = ["ground truth", "CDEIT", "std (uncertainty)" if std is not None else None,
          *[f"{k} (scaled)" for k in baselines]]
  cols = [c for c in cols if c]
  n = min(len(names), max_rows)
  mask = disk_mask(target.shape[1])
  fig, axes = plt.subplots(n, len(cols), figsize=(2.2 * len(cols) + 0.8, 2.1 * n), squeeze=False)
  for r in range(n):
    panels = [target[r, ..., 0], pred[r, ..., 0]]
    if std is not None:
      panels.append(std[r, ..., 0])
    panels += [b[r] for b in baselines.values()]
    for c, (img, title) in enumerate(zip(panels, cols)):
      ax = axes[r, c]
      shown = np.ma.masked_where(~mask, img)
      is_std = title.startswith("std")
      im = ax.imshow(shown, origin="lower", cmap="viridis" if is_std else "RdBu_r",
                     vmin=0 if is_std else -1, vmax=None if is_std else 1)
      ax.set_xticks([])
      ax.set_yticks([])
      if r == 0:
        ax.set_title(title, fontsize=9)
      if c == 0:
        ax.set_ylabel(names[r], fontsize=8)
      fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=80)
  plt.close(fig)
  with open(path, "wb") as fh:
    fh.write(buf.getvalue())
