"""Reconstruct a test set with a trained or imported CDEIT (eval.py): choose the checkpoint,
condition the data as training did, sample (`sampling`), score (`metrics.score`), write the
outputs (`outputs`).

Each example's noise comes from fold_in(fold_in(key(seed), sample), example index), so the
reconstructions do not depend on the batch size or the number of devices or hosts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sys
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from cdeit_jax.checkpoints import checkpoint
from cdeit_jax.common import compile_cache, fileio, logs
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import npz_files, pipeline, sources
from cdeit_jax.eit import measurement
from cdeit_jax.infer import metrics, outputs, reconstructor

log = logs.log.getChild("eval")
CHUNK = 64  # examples sampled, scored and written at a time (about 32 MB at K = 8)
assert CHUNK >= outputs.SHOWN


def check_scale(src, preset: str, limit: int = 8) -> None:
  """Refuse data whose standardised voltages are far off the statistics' scale: the files were
  made with other voltage/current units than the preset says (e.g. tank data as `simulated`)."""
  n = min(len(src), limit)
  v = np.concatenate([np.ravel(src[i]["voltages"]) for i in range(n)])
  typical = float(np.median(np.abs(v)))
  if not typical < reconstructor.FAR_OFF:
    raise InputError(
        f"{src.path}: its voltages, standardised for preset {preset!r}, are ~{typical:.3g} "
        "standard deviations from the training mean (expected a few): the files are in other "
        "units than this preset; give the preset they were made with (--data uef2017, ktc2023, "
        "simulated) or --voltage-ratio/--current-ratio")


def evaluate(path: str, data_name: str, data_path: str, out: str,
             overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """Reconstruct the npz files of `data_path` (preset `data_name`) with the checkpoint at `path`
  (a run: its best validated step that loads, else the latest; or one `RUN/checkpoints/STEP`)
  and write every output into `out`; returns metrics.json's content.

  `overrides` (dotted keys, as `--config.sampling.steps=2` gives them) change the sampling and
  evaluation settings and the model's runtime keys of the checkpoint's config."""
  t_start = time.perf_counter()
  choice = reconstructor.choose(path, overrides)  # bad keys and values fail before any work
  if jax.process_index() == 0:
    outputs.check_out(out, data_path)
    logs.debug_log(out)
  cfg = choice.cfg
  s, e = cfg.sampling, cfg.eval
  if e.fit_uncertainty and (data_name != "simulated" or s.num_samples < 2):
    raise InputError("--config.eval.fit_uncertainty=True fits the uncertainty scale on "
                     "simulations with several samples: use --data simulated (a validation "
                     "split) and --config.sampling.num_samples=8")
  # --- the data, conditioned as in training
  voltage_ratio, current_ratio = measurement.resolve_ratios(data_name, e.voltage_ratio,
                                                            e.current_ratio)
  src = sources.NpzSource(data_path, data_name, e.stats, voltage_ratio=voltage_ratio,
                       current_ratio=current_ratio,
                       checkpoint_stats=checkpoint.meta_stats(choice.meta),
                       baselines=True, skip_bad=e.skip_bad_files)
  n_total = len(src) if e.max_examples is None else min(len(src), e.max_examples)
  check_scale(src, data_name)
  mesh = shd.make_mesh()
  model, meta = reconstructor.load_model(choice, mesh)
  workdir = choice.workdir

  if model.conditioner is not None and not (
      np.allclose(model.conditioner.voltage_mean[...], src.mean.ravel(), rtol=1e-6, atol=0) and
      np.allclose(model.conditioner.voltage_std[...], src.std.ravel(), rtol=1e-6, atol=0)):
    log.warning(f"{data_path} is standardised with other statistics than this physics-"
                "informed model was trained with, so its linear input channels are computed "
                "from wrong voltages; use the checkpoint's statistics (no --config.eval.stats, "
                "and no mean/std in the data folder's parent)")

  # --- the sampler (the API's), compiled for the largest batch that fits
  shape = (model.image_size, model.image_size, model.in_channels)
  t0 = time.perf_counter()
  with compile_cache.Watch() as cache:
    rec = reconstructor.Reconstructor(
        model, cfg, src.mean, src.std, preset=data_name, voltage_ratio=voltage_ratio,
        current_ratio=current_ratio, mesh=mesh, num_examples=n_total)
  global_batch = rec.max_batch
  compile_s = time.perf_counter() - t0
  log.info(f"sampler (global batch {global_batch}, {s.steps} steps) "
           f"{'loaded from the persistent compilation cache' if cache.hit else 'compiled'} in "
           f"{compile_s:.1f} s; sampling starts {time.perf_counter() - t_start:.1f} s after the "
           "start")

  # --- K samples of every example, a chunk of examples at a time, scored and written as they
  # come (memory flat); global batch b holds examples b*G .. b*G+G-1
  primary = jax.process_index() == 0
  chunk = global_batch * max(1, CHUNK // global_batch)
  batches = pipeline.eval_batches(src, global_batch, keys=("cond",), limit=n_total)
  calibration = choice.calibration_file
  fitted = e.fit_uncertainty
  scale = None if fitted else reconstructor.uncertainty_scale(calibration)
  staged = outputs.Staged(out) if primary else None
  with outputs.failing(staged) if primary else contextlib.nullcontext():
    if primary:
      predictions = outputs.Predictions(staged.work, n_total, shape, s.num_samples,
                                        current_ratio / voltage_ratio)
      baseline_names = (("tikhonov",) if e.tikhonov else ()) + tuple(npz_files.BASELINE_KEYS)
      scores = metrics.Scores(baseline_names)
      coverage = metrics.Coverage(scale) if s.num_samples > 1 else None
      if e.tikhonov:
        from cdeit_jax import eit
        tikhonov = eit.default_tikhonov(contact_impedance=float(cfg.simulator.contact_impedance))
    shown: dict[str, Any] = {}

    def take_in(lo: int, samples: np.ndarray) -> None:
      """Score and write examples lo .. lo + len: in a worker thread, while the devices sample
      the next chunk (host work off the hot path)."""
      hi = lo + samples.shape[1]
      pred, std = reconstructor.summarise(samples)
      examples = [src[i] for i in range(lo, hi)]
      target = np.stack([ex["target"] for ex in examples])
      stored = {k: np.stack([ex[k] for ex in examples])[..., 0] for k in npz_files.BASELINE_KEYS}
      if e.tikhonov:
        stored = {"tikhonov": tikhonov(np.stack([ex["ys"] for ex in examples])), **stored}
      scaled = scores.add(pred[..., 0], target[..., 0], stored)
      if coverage is not None:
        coverage.add(pred[..., 0], std[..., 0], target[..., 0])
      predictions.add(lo, pred, target, std, samples)
      if lo == 0 and e.figure:  # the figure's examples: the first chunk's (CHUNK >= SHOWN)
        n = outputs.SHOWN
        shown.update(target=target[:n], pred=pred[:n], std=None if std is None else std[:n],
                     baselines={k: v[:n] for k, v in scaled.items()})

    sample_s = 0.0
    bar = tqdm(total=n_total * s.num_samples, desc="sampling", unit="image", file=sys.stderr,
               disable=not primary, mininterval=1.0)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
      pending = None  # one chunk in the worker, one being sampled: memory stays two chunks
      for lo in range(0, n_total, chunk):
        hi = min(n_total, lo + chunk)
        mine = [next(batches) for _ in range(-(-(hi - lo) // global_batch))]
        samples = np.zeros((s.num_samples, hi - lo, *shape), np.float32)
        t0 = time.perf_counter()
        for k in range(s.num_samples):
          for j, b in enumerate(mine):
            imgs = rec.sample_local(b["cond"], b["index"], k)
            at = j * global_batch
            take = min(global_batch, hi - lo - at)
            samples[k, at:at + take] = imgs[:take]
            bar.update(take)
        sample_s += time.perf_counter() - t0
        if primary:
          if pending is not None:
            pending.result()  # its errors are raised here
          pending = worker.submit(take_in, lo, samples)
      if pending is not None:
        pending.result()
    bar.close()
    done = n_total * s.num_samples
    result = {"images_per_s": done / sample_s, "ms_per_image": 1000 * sample_s / done,
              "compile_s": compile_s, "compile_cache_hit": cache.hit,
              "devices": jax.device_count(),
              "processes": jax.process_count(), "global_batch": global_batch}
    if not primary:
      return result

    # --- the scores beside the baselines, the uncertainty's calibration, the outputs
    report, rows = scores.result()
    if coverage is not None:
      if fitted:
        scale = coverage.fit()
        fileio.write_text(calibration, json.dumps(
            {"scale": scale, "fitted_on": fileio.resolve(data_path), "examples": n_total,
             "num_samples": s.num_samples, "sampling_steps": s.steps, "eta": s.eta}, indent=1))
        log.info(f"uncertainty scale {scale:.3f} fitted on {n_total} examples, kept in "
                 f"{calibration}")
      report["uncertainty"] = coverage.result(scale)
      predictions.scale_std(scale)  # the uncertainty offered: calibrated
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
    figure = None
    if e.figure:
      figure = {**shown, "baselines": {k: v for k, v in shown["baselines"].items() if k in report}}
      if shown["std"] is not None:
        figure["std"] = shown["std"] * np.float32(scale)
    names = [src.files[i] for i in range(n_total)]
    outputs.write_outputs(staged, result, rows, names, predictions, figure)
  return result
