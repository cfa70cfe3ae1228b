"""Reconstruct a test set with a trained or imported CDEIT (eval.py): choose the checkpoint,
condition the data as training did, sample (`sampling`), score (`metrics.score`), write the
outputs (`outputs`).

Each example's noise comes from fold_in(fold_in(key(seed), sample), example index), so the
reconstructions do not depend on the batch size or the number of devices or hosts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from tqdm import tqdm

from cdeit_jax import checkpoint, compile_cache, config_lib, data, fileio, logs, measurement
from cdeit_jax import metrics, models
from cdeit_jax import outputs, pipeline, sampling
from cdeit_jax import files as npz_files
from cdeit_jax import sharding as shd
from cdeit_jax.diffusion import Diffusion
from cdeit_jax.errors import InputError

log = logs.log.getChild("eval")


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


# What eval.py may set; everything else (model, data, diffusion) is the checkpoint's.
SETTABLE = ("sampling.", "eval.", *(f"model.{k}" for k in models.RUNTIME_MODEL_KEYS))


def settings(meta: dict[str, Any], overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The checkpoint's config with `overrides` (dotted keys) applied and the evaluation settings
  checked; errors name `--config.<key>`."""
  for key in overrides:
    if not key.startswith(SETTABLE):
      raise InputError(f"--config.{key}: evaluation takes the model, data and training settings "
                       "from the checkpoint; only config.sampling.*, config.eval.* and "
                       f"config.model.{{{','.join(models.RUNTIME_MODEL_KEYS)}}} can be set")
  cfg = models.model_config(meta)
  config_lib.override(cfg, overrides)
  s, e = cfg.sampling, cfg.eval

  def need(ok: bool, key: str, msg: str) -> None:
    if not ok:
      section, leaf = key.split(".")
      raise InputError(f"--config.{key}={cfg[section][leaf]!r}: {msg}")

  need(s.steps >= 1, "sampling.steps", "must be >= 1")
  need(s.num_samples >= 1, "sampling.num_samples", "must be >= 1")
  need(0 <= s.eta <= 1, "sampling.eta", "must be in [0, 1] (0: deterministic DDIM, 1: the "
       "published sampler)")
  need(s.data_consistency >= 0, "sampling.data_consistency", "must be >= 0 (0 = off)")
  need(s.data_consistency_alpha > 0, "sampling.data_consistency_alpha", "must be > 0")
  need(e.max_examples is None or e.max_examples >= 1, "eval.max_examples", "must be >= 1")
  need(e.weights in checkpoint.WEIGHT_ITEMS, "eval.weights",
       f"must be one of {sorted(checkpoint.WEIGHT_ITEMS)}")
  return cfg


UNCERTAINTY_FILE = "uncertainty.json"  # in a step folder: the std's calibration factor


def uncertainty_scale(path: str) -> float:
  """The calibration factor kept at `path` (a step folder's UNCERTAINTY_FILE); 1 if none."""
  try:
    record = json.loads(fileio.path(path).read_text())
  except FileNotFoundError:
    return 1.0
  except (OSError, ValueError) as e:
    raise InputError(f"{path}: unreadable ({e}); delete it (the std is then uncalibrated) or "
                     "fit it again with --config.eval.fit_uncertainty=True") from None
  scale = record.get("scale") if isinstance(record, dict) else None
  if not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
    raise InputError(f"{path}: 'scale' must be a positive number, got {scale!r}; delete the "
                     "file or fit it again with --config.eval.fit_uncertainty=True")
  return float(scale)


def _candidates(workdir: str, path: str, step: int | None) -> list[int]:
  """The steps to try, in order: the one asked for (a step folder or --config.eval.step), else
  the validated steps best first, then the others newest first."""
  asked = step if step is not None else checkpoint.step_folder(path)
  if asked is not None:
    return [asked]
  ranked = checkpoint.ranked_steps(workdir)
  return ranked + [st for st in checkpoint.all_steps(workdir)[::-1] if st not in ranked]


def evaluate(path: str, data_name: str, data_path: str, out: str,
             overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """Reconstruct the npz files of `data_path` (preset `data_name`) with the checkpoint at `path`
  (a run: its best validated step that loads, else the latest; or one `RUN/checkpoints/STEP`)
  and write every output into `out`; returns metrics.json's content.

  `overrides` (dotted keys, as `--config.sampling.steps=2` gives them) change the sampling and
  evaluation settings and the model's runtime keys of the checkpoint's config."""
  t_start = time.perf_counter()
  overrides = dict(overrides or {})
  settings({"model": {}}, overrides)  # bad keys and values fail before any work
  if jax.process_index() == 0:
    outputs.check_out(out, data_path)
    logs.debug_log(out)

  # --- the checkpoint: the first candidate whose metadata and weights load
  workdir, _ = checkpoint.resolve(path, overrides.get("eval.step"))
  candidates = _candidates(workdir, path, overrides.get("eval.step"))
  skipped: dict[int, str] = {}  # damaged steps passed over, reported once the choice is made
  step, meta = checkpoint.first_readable(workdir, candidates, skipped)
  cfg = settings(meta, overrides)
  s, e = cfg.sampling, cfg.eval
  if e.fit_uncertainty and (data_name != "simulated" or s.num_samples < 2):
    raise InputError("--config.eval.fit_uncertainty=True fits the uncertainty scale on "
                     "simulations with several samples: use --data simulated (a validation "
                     "split) and --config.sampling.num_samples=8")
  # --- the data, conditioned as in training
  voltage_ratio, current_ratio = measurement.resolve_ratios(data_name, e.voltage_ratio,
                                                            e.current_ratio)
  src = data.NpzSource(data_path, data_name, e.stats, voltage_ratio=voltage_ratio,
                       current_ratio=current_ratio, checkpoint_stats=checkpoint.meta_stats(meta),
                       baselines=True, skip_bad=e.skip_bad_files, cache=True)
  n_total = len(src) if e.max_examples is None else min(len(src), e.max_examples)
  check_scale(src, data_name)
  runtime = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("model.")}
  mesh = shd.make_mesh()
  load = lambda st: models.load(workdir, weights=e.weights, step=st,
                                sharding=shd.replicated(mesh), **runtime)
  step, (model, meta) = checkpoint.first_intact(candidates[candidates.index(step):], load,
                                                skipped, fileio.join(workdir, "checkpoints"))
  for bad, reason in skipped.items():
    log.warning(f"skipping checkpoint step {bad}: {reason}")

  if model.conditioner is not None and not (
      np.allclose(model.conditioner.voltage_mean[...], src.mean.ravel(), rtol=1e-6, atol=0) and
      np.allclose(model.conditioner.voltage_std[...], src.std.ravel(), rtol=1e-6, atol=0)):
    log.warning(f"{data_path} is standardised with other statistics than this physics-"
                "informed model was trained with, so its linear input channels are computed "
                "from wrong voltages; use the checkpoint's statistics (no --config.eval.stats, "
                "and no mean/std in the data folder's parent)")

  # --- the sampler, compiled for the largest batch that fits
  graphdef, weights = nnx.split(model)
  diffusion = Diffusion(**cfg.diffusion)
  shape = (model.image_size, model.image_size, model.in_channels)
  correction_graphdef = None
  if s.data_consistency:
    from cdeit_jax import conditioning
    dc = conditioning.DataConsistency(src.mean, src.std, strength=s.data_consistency,
                                      alpha=s.data_consistency_alpha,
                                      contact_impedance=cfg.simulator.contact_impedance)
    correction_graphdef, dc_state = nnx.split(dc)
    weights = (weights, jax.device_put(dc_state, shd.replicated(mesh)))
  sampler = sampling.make_sampler(graphdef, diffusion, s.steps, s.eta, shape, mesh,
                                  correction_graphdef)
  t0 = time.perf_counter()
  with compile_cache.Watch() as cache:
    sampler, global_batch = sampling.compile_sampler(sampler, weights, mesh, n_total,
                                                     s.batch_size, cond_size=model.cond_size)
  compile_s = time.perf_counter() - t0
  log.info(f"sampler (global batch {global_batch}, {s.steps} steps) "
           f"{'loaded from the persistent compilation cache' if cache.hit else 'compiled'} in "
           f"{compile_s:.1f} s; sampling starts {time.perf_counter() - t_start:.1f} s after the "
           "start")

  # --- K samples of every example
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
      imgs = sampling.gather(sampler(weights, g["cond"], g["index"], key_k))
      idx, mask = sampling.gather(g["index"]), sampling.gather(g["mask"]) > 0
      samples[k, idx[mask]] = imgs[mask]
      done += int(mask.sum())
      bar.update(int(mask.sum()))
  sample_s = time.perf_counter() - t0
  bar.close()
  result = {"images_per_s": done / sample_s, "ms_per_image": 1000 * sample_s / done,
            "compile_s": compile_s, "compile_cache_hit": cache.hit,
            "devices": jax.device_count(),
            "processes": jax.process_count(), "global_batch": global_batch}
  if jax.process_index() != 0:
    return result

  # --- scores beside the baselines, and the outputs
  pred = samples.mean(0)
  std = samples.std(0) if s.num_samples > 1 else None
  target = np.stack([src[i]["target"] for i in range(n_total)])
  calibration = fileio.join(workdir, "checkpoints", str(int(meta["step"])), UNCERTAINTY_FILE)
  if e.fit_uncertainty:
    scale = metrics.fit_uncertainty_scale(pred[..., 0], std[..., 0], target[..., 0])
    fileio.write_text(calibration, json.dumps(
        {"scale": scale, "fitted_on": fileio.resolve(data_path), "examples": n_total,
         "num_samples": s.num_samples, "sampling_steps": s.steps, "eta": s.eta}, indent=1))
    log.info(f"uncertainty scale {scale:.3f} fitted on {n_total} examples, kept in "
             f"{calibration}")
  scale = uncertainty_scale(calibration)
  examples = [src[i] for i in range(n_total)]  # cached: each file was read once
  names = [src.files[i] for i in range(n_total)]
  stored = {k: np.stack([ex[k] for ex in examples])[..., 0] for k in npz_files.BASELINE_KEYS}
  if e.tikhonov:
    from cdeit_jax import eit
    ys = np.stack([ex["ys"] for ex in examples])  # ys / voltage_ratio
    tikhonov = eit.default_tikhonov(contact_impedance=float(cfg.simulator.contact_impedance))
    stored = {"tikhonov": tikhonov(ys), **stored}
  report, rows, baselines = metrics.score(pred[..., 0], target[..., 0], stored)
  if std is not None:
    report["uncertainty"] = metrics.uncertainty(pred[..., 0], std[..., 0], target[..., 0], scale)
    std = std * scale  # the uncertainty offered: calibrated
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
  outputs.write_outputs(out, result, rows, names, pred, target, std, samples, baselines,
                        current_ratio / voltage_ratio, e.figure)
  return result
