"""Reconstruct a test set with a trained or imported CDEIT: sharded sampling, metrics, outputs.

Each example's noise comes from fold_in(fold_in(key(seed), sample), example index), so the
reconstructions do not depend on the batch size or the number of devices or hosts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import nnx

from cdeit_jax import aot, checkpoint, config_lib, data, logs, metrics, training
from cdeit_jax.eit.phantom import disk_mask  # noqa: F401  (the grid's disk, for figures)
from cdeit_jax.fileio import atomic_write
from cdeit_jax import sharding as shd
from cdeit_jax.diffusion import Diffusion


@dataclass
class EvalSettings:
  checkpoint: str
  data: str                     # preset name (simulated, uef2017, ktc2023) or any name with ratios
  data_path: str
  out: str
  weights: str = "ema"
  step: int | None = None       # default: the best validated step, else the latest
  sampling_steps: int = 5
  eta: float = 1.0
  num_samples: int = 1
  seed: int = 0
  batch_size: int | None = None  # global; default: the largest that fits (compile_sampler)
  stats: str | None = None
  voltage_ratio: float | None = None
  current_ratio: float | None = None
  max_examples: int | None = None
  config: Any = None            # optional config whose model section must match the checkpoint
  dtype: str | None = None
  attention_query_chunk: int | None = None  # lower attention memory (see CDEIT)
  figure: bool = True
  tikhonov: bool = False        # also the built-in one-step Tikhonov/NOSER baseline (cdeit_jax.eit)
  data_consistency: float = 0.0  # > 0: the sampler's data-consistency step with this strength
  data_consistency_alpha: float = 0.1
  skip_bad_files: bool = False  # skip unreadable/invalid data files with a warning
  extra: dict = field(default_factory=dict)


# Everything an evaluation writes into its output folder (metrics.json last: it marks a complete
# evaluation). Each is written atomically, and all of them are removed first, so an output
# folder never holds one evaluation's figure beside another's metrics.
OUTPUTS = ("reconstructions.png", "predictions.mat", "predictions.npz", "metrics.csv",
           "metrics.json")


def check_out(out: str) -> None:
  """Fail before any work when `out` cannot take the outputs (a file, read-only, ...)."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out {out}: exists and is not a folder; give a folder path")
  try:
    os.makedirs(out, exist_ok=True)
    probe = os.path.join(out, f".write-test-{os.getpid()}")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"--out {out}: cannot write there ({e.strerror or e}); give a writable "
                     "folder") from None


def _first_readable(workdir: str, candidates: list[int], log) -> tuple[int, dict]:
  """(step, meta) of the first candidate whose metadata reads; each skipped step is one line."""
  for i, step in enumerate(candidates):
    try:
      return step, checkpoint.read_meta(workdir, step)
    except checkpoint.CheckpointError as e:
      if i == len(candidates) - 1:
        raise
      log(f"warning: skipping checkpoint step {step}: {e}")
  raise checkpoint.CheckpointError(f"checkpoint {workdir}: no step to evaluate")


def check_scale(src, preset: str, limit: int = 8) -> None:
  """Refuse data whose standardised voltages are far off the statistics' scale: the files were
  made with other voltage/current units than the preset says (e.g. tank data as `simulated`)."""
  n = min(len(src), limit)
  v = np.concatenate([np.ravel(src[i]["voltages"]) for i in range(n)])
  typical = float(np.median(np.abs(v)))
  if not typical < 100:
    raise ValueError(
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


def _check_model_config(cfg, meta: dict) -> None:
  want = dict(cfg.model)
  have = meta["model"]
  diff = {k: (want.get(k), have.get(k)) for k in set(want) | set(have)
          if k not in checkpoint.RUNTIME_MODEL_KEYS and want.get(k) != have.get(k)}
  if diff:
    listing = ", ".join(f"model.{k}: config {a!r}, checkpoint {b!r}"
                        for k, (a, b) in sorted(diff.items()))
    raise ValueError(f"the checkpoint's model settings disagree with the config: {listing}")


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
                    cond_size: int = 16, fraction: float = 0.8, log=print):
  """Compile `sampler` for the largest batch that fits the devices; returns (executable, batch).

  `batch_size` (global) is taken as given. Otherwise per-device batches 8, 4, 2, 1 (never more
  than the examples need) are compiled in turn until the compiler's memory analysis says the
  program fits `fraction` of the memory budget (`memory_budget`)."""
  import jax.numpy as jnp
  n = mesh.devices.size
  if batch_size is not None:
    if batch_size < 1 or batch_size % n:
      raise ValueError(f"--batch-size {batch_size} must be a positive multiple of the {n} devices")
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
      log(f"sampler: batch {g} does not fit ({str(e).splitlines()[0][:120]}); trying smaller")
      continue
    need = training.memory_of(compiled).get("peak_bytes")
    if batch_size is not None or need is None or budget is None or \
        need * sharing <= fraction * budget:
      return compiled, g
    log(f"sampler: batch {g} needs ~{need * sharing / 2 ** 30:.1f} GiB of "
        f"{budget / 2 ** 30:.1f} GiB available; trying a smaller batch")
  log(f"sampler: even batch {n} may not fit the available memory; trying it anyway")
  return compiled, n


def _gather(x: jax.Array) -> np.ndarray:
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def evaluate(s: EvalSettings, log=print) -> dict[str, Any]:
  """Run the evaluation and write every output into `s.out`; returns metrics.json's content."""
  if s.num_samples < 1:
    raise ValueError(f"--num-samples must be >= 1, got {s.num_samples}")
  if s.sampling_steps < 1:
    raise ValueError(f"--sampling-steps must be >= 1, got {s.sampling_steps}")
  if not s.data_consistency >= 0:
    raise ValueError(f"--data-consistency must be >= 0 (0 = off), got {s.data_consistency}")
  if not s.data_consistency_alpha > 0:
    raise ValueError(f"--data-consistency-alpha must be > 0, got {s.data_consistency_alpha}")
  if s.max_examples is not None and s.max_examples < 1:
    raise ValueError(f"--max-examples must be >= 1, got {s.max_examples}")
  if jax.process_index() == 0:
    check_out(s.out)
    logs.debug_log(s.out)
  workdir, resolved = checkpoint.resolve(s.checkpoint, s.step)
  step_dir = os.path.basename(os.path.normpath(s.checkpoint)).isdigit()
  if s.step is not None or step_dir:
    step, meta = resolved, checkpoint.read_meta(workdir, resolved)
    candidates = [step]
  else:
    ranked = checkpoint.ranked_steps(workdir)
    candidates = ranked + [st for st in checkpoint.all_steps(workdir)[::-1] if st not in ranked]
    step, meta = _first_readable(workdir, candidates, log)
  if s.config is not None:
    _check_model_config(s.config, meta)
  voltage_ratio, current_ratio = data.resolve_ratios(s.data, s.voltage_ratio, s.current_ratio)
  src = data.NpzSource(s.data_path, s.data, s.stats, voltage_ratio=voltage_ratio,
                       current_ratio=current_ratio, checkpoint_stats=checkpoint.meta_stats(meta),
                       baselines=True, skip_bad=s.skip_bad_files)
  n_total = len(src) if s.max_examples is None else min(len(src), s.max_examples)
  check_scale(src, s.data)

  mesh = shd.make_mesh()
  skipped = []
  with logs.StderrCapture() as capture:  # a failed restore's TensorStore noise -> debug log
    while True:  # the chosen step, or (damaged weights) the next candidate
      try:
        model, meta = checkpoint.load_model(workdir, weights=s.weights, step=step, dtype=s.dtype,
                                            sharding=shd.replicated(mesh),
                                            attention_query_chunk=s.attention_query_chunk)
        break
      except checkpoint.CheckpointError as e:
        capture.failed = True
        rest = candidates[candidates.index(step) + 1:]
        if not rest:
          raise
        skipped.append(f"warning: skipping checkpoint step {step}: {e}")
        step, meta = _first_readable(workdir, rest, skipped.append)
  for line in skipped:
    log(line)
  if model.conditioner is not None and not (
      np.allclose(model.conditioner.voltage_mean[...], src.mean.ravel(), rtol=1e-6, atol=0) and
      np.allclose(model.conditioner.voltage_std[...], src.std.ravel(), rtol=1e-6, atol=0)):
    log(f"warning: {s.data_path} is standardised with other statistics than this physics-"
        "informed model was trained with, so its linear input channels are computed from wrong "
        "voltages; use the checkpoint's statistics (no --stats, and no mean/std in the data "
        "folder's parent)")
  graphdef, weights = nnx.split(model)
  diffusion = Diffusion(**{**config_lib.default_config().diffusion,
                           **meta["config"].get("diffusion", {})})
  shape = (model.image_size, model.image_size, model.in_channels)
  correction_graphdef = None
  if s.data_consistency:
    from cdeit_jax import conditioning
    dc = conditioning.DataConsistency(src.mean, src.std, strength=s.data_consistency,
                                      alpha=s.data_consistency_alpha)
    correction_graphdef, dc_state = nnx.split(dc)
    weights = (weights, jax.device_put(dc_state, shd.replicated(mesh)))
  sampler = make_sampler(graphdef, diffusion, s.sampling_steps, s.eta, shape, mesh,
                         correction_graphdef)
  t0 = time.perf_counter()
  sampler, global_batch = compile_sampler(sampler, weights, mesh, n_total, s.batch_size,
                                          cond_size=model.cond_size, log=log)
  compile_s = time.perf_counter() - t0
  batches = list(data.eval_batches(src, global_batch, keys=("cond",), limit=n_total))
  key = jax.random.key(s.seed)

  samples = np.zeros((s.num_samples, n_total, *shape), np.float32)
  t0 = time.perf_counter()
  done = 0
  for k in range(s.num_samples):
    key_k = jax.random.fold_in(key, k)
    for b in batches:
      g = data.to_global(b, mesh)
      out = _gather(sampler(weights, g["cond"], g["index"], key_k))
      idx, mask = _gather(g["index"]), _gather(g["mask"]) > 0
      samples[k, idx[mask]] = out[mask]
      done += int(mask.sum())
      log(f"\rsampling: {done}/{n_total * s.num_samples} images", end="")
  sample_s = time.perf_counter() - t0
  log("")
  result = {"images_per_s": done / sample_s, "ms_per_image": 1000 * sample_s / done,
            "compile_s": compile_s, "devices": jax.device_count(),
            "processes": jax.process_count(), "global_batch": global_batch}
  if jax.process_index() != 0:
    return result

  pred = samples.mean(0)
  std = samples.std(0) if s.num_samples > 1 else None
  examples = [src[i] for i in range(n_total)]  # one read per file for targets and baselines
  target = np.stack([e["target"] for e in examples])
  names = [src.files[i] for i in range(n_total)]
  overall, rows = metrics.summary(pred[..., 0], target[..., 0])
  empty = metrics.summary(np.zeros_like(pred[..., 0]), target[..., 0])[0]
  report = {"cdeit": overall, "empty": {k: v for k, v in empty.items() if k != "cc"}}  # CC: undefined
  stored = {k: np.stack([e[k] for e in examples])[..., 0] for k in data.BASELINE_KEYS}
  if s.tikhonov:
    from cdeit_jax import eit
    # ys / voltage_ratio, recovered from the examples already read (no second read per file)
    ys = (np.stack([e["voltages"] for e in examples]) * src.std + src.mean).reshape(n_total, -1)
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
                   "weights": s.weights, "data": s.data, "data_path": os.path.abspath(s.data_path),
                   "voltage_ratio": voltage_ratio, "current_ratio": current_ratio,
                   "sampling_steps": s.sampling_steps, "eta": s.eta,
                   "data_consistency": s.data_consistency,
                   "data_consistency_alpha": s.data_consistency_alpha,
                   "num_samples": s.num_samples, "seed": s.seed, "examples": n_total,
                   "model": meta["model"], "dtype": s.dtype or meta["model"]["dtype"]},
  })
  write_outputs(s.out, result, rows, names, pred, target, std, samples, baselines,
                current_ratio / voltage_ratio, s.figure)
  return result


def write_outputs(out: str, result: dict, rows: list[dict], names: list[str], pred: np.ndarray,
                  target: np.ndarray, std: np.ndarray | None, samples: np.ndarray,
                  baselines: dict[str, np.ndarray], mat_scale: float, figure: bool) -> None:
  import scipy.io

  os.makedirs(out, exist_ok=True)
  for name in reversed(OUTPUTS):  # an earlier evaluation's outputs go, metrics.json first
    path = os.path.join(out, name)
    if os.path.exists(path):
      os.remove(path)

  def write_csv(p):
    with open(p, "w", newline="") as fh:
      w = csv.DictWriter(fh, fieldnames=["name", *rows[0].keys()])
      w.writeheader()
      for name, r in zip(names, rows):
        w.writerow({"name": name, **r})

  atomic_write(os.path.join(out, "metrics.csv"), write_csv)
  arrays = {"pred": pred, "target": target, "names": np.asarray(names)}
  if std is not None:
    arrays.update(std=std, samples=samples)

  def write_npz(p):
    with open(p, "wb") as fh:
      np.savez(fh, **arrays)

  atomic_write(os.path.join(out, "predictions.npz"), write_npz)
  mat = {"pred": (pred[..., 0] * mat_scale).astype(np.float64),
         "target": target[..., 0].astype(np.float64), "names": np.asarray(names, dtype=object),
         "scale": mat_scale}
  if std is not None:
    mat["std"] = (std[..., 0] * abs(mat_scale)).astype(np.float64)
  atomic_write(os.path.join(out, "predictions.mat"),
                lambda p: scipy.io.savemat(p, mat, do_compression=True))
  if figure:
    atomic_write(os.path.join(out, "reconstructions.png"),
                  lambda p: save_figure(p, names, target, pred, std, baselines))
  text = json.dumps(_json_clean(result), indent=2, allow_nan=False)
  atomic_write(os.path.join(out, "metrics.json"), lambda p: _write_text(p, text))


def _write_text(path: str, text: str) -> None:
  with open(path, "w") as fh:
    fh.write(text)


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
