"""Reconstruct a test set with a trained or imported CDEIT (eval.py), in three phases of one
object, `Evaluator`:

  prepare  open the run (`run_opening.open_run`: its checkpoint, system and frames resolved once)
           and load its model, open the data in the units it was made in and check them, make
           the Reconstructor (its guards and compiled sampler);
  run      reconstruct every example (the Reconstructor's `reconstruct_conditions`, its answer
           as the model's output kind gives it), a chunk at a time, while a worker thread
           scores (`metrics`) and writes (`outputs`) the chunk before (memory stays flat);
  finish   the scores beside the baselines, the uncertainty's calibration, the outputs, published
           whole (`outputs.Staged`).

Each example's noise comes from fold_in(fold_in(key(seed), sample), example index), so the
reconstructions do not depend on the batch size or the number of devices or hosts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time
from typing import Any

import jax
import numpy as np

from cdeit_jax.checkpoints import reader, shipped
from cdeit_jax.common import compile_cache, fileio, logs
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import InputError
from cdeit_jax.data import npz_files, sources
from cdeit_jax.infer import frame_guards, intervals, metrics, outputs, reconstructor, run_opening

log = logs.log.getChild("eval")
CHUNK = 64  # examples sampled, scored and written at a time (about 32 MB at K = 8)
assert CHUNK >= outputs.SHOWN


def check_scale(src, units: str, limit: int = 8) -> None:
  """Refuse data whose standardised voltages are far off the statistics' scale: the files were
  made with other voltage/current units than `units` says (e.g. tank data as `simulated`)."""
  n = min(len(src), limit)
  v = np.concatenate([np.ravel(src[i]["voltages"]) for i in range(n)])
  typical = float(np.median(np.abs(v[np.isfinite(v)]))) if np.isfinite(v).any() else np.inf
  if not typical < frame_guards.FAR_OFF:
    raise InputError(
      f"{src.path}: its voltages, standardised in the units {units!r}, are ~{typical:.3g} "
      "standard deviations from the training mean (expected a few): the data are in other "
      "units; give the units they were made in (--units simulated, uef2017, ktc2023, or "
      "--config.eval.voltage_ratio and --config.eval.current_ratio)"
    )


def run(
  kind, path: str, data_path: str, out: str, overrides=None, units=None, evaluator=None
) -> dict[str, Any]:
  """A folder of npz files (`data_kinds`' simulated, uef2017 and named systems), or with
  `evaluator` (an `Evaluator` class) its kind of data."""
  ev = (evaluator or Evaluator)(path, kind, data_path, out, overrides, units).prepare()
  with ev.staging():
    ev.run()
    r = ev.finish()
  ev.track(r)
  return r


class Evaluator:
  """One evaluation of a test set (module docstring): `prepare()`, then inside `staging()`
  `run()` and `finish()`. Only process 0 scores and writes; every process samples."""

  def __init__(
    self,
    path: str,
    kind,
    data_path: str,
    out: str,
    overrides: dict[str, Any] | None = None,
    units: str | None = None,
  ):
    self.path, self.kind, self.data_path, self.out = path, kind, data_path, out
    self.data_name, self.given_units = kind.name, units
    self.overrides, self.given_overrides = dict(overrides or {}), overrides
    self.primary = jax.process_index() == 0
    self.t_start = time.perf_counter()

  # --------------------------------------------------------------------------- prepare

  def prepare(self) -> Evaluator:
    """Choose and load the model, open and check the data, compile the sampler."""
    # bad keys and values fail before any work
    with run_opening.open_run(self.path, self.overrides) as opened:
      self.cfg, run = opened.cfg, opened.run
      self._check_request(run.workdir)
      self._open_data(opened)
      self.mesh = shd.make_mesh()
      loaded = run_opening.load_opened(opened, self.mesh)
    self.meta, self.workdir = loaded.meta, run.workdir
    self.calibration_file = run_opening.calibration_file(run, loaded.meta.step)
    self.calibration = run_opening.calibration(run, loaded.meta.step, self.cfg)
    self._check_statistics(loaded.model)
    self._compile(loaded.model)
    return self

  def track(self, r: dict[str, Any]) -> None:
    """The metrics and figure into the W&B run of the workdir (process 0): when the training
    logged to W&B (WORKDIR/wandb.json) or --config.wandb.project is given."""
    from cdeit_jax.common import tracking

    asked = any(k.startswith("wandb.") for k in self.overrides)
    if not self.primary or "metrics" not in r:
      return
    try:
      known = tracking.read_run(self.workdir) is not None
    except InputError as e:  # W&B's failures never stop the command
      log.warning(f"W&B: {e}; the evaluation is not logged to W&B")
      return
    if asked or known:
      figure = fileio.join(self.out, "reconstructions.png")
      tracking.log_evaluation(
        self.cfg, self.workdir, self.out, self.data_name, r["metrics"], figure
      )

  def _check_request(self, workdir: str) -> None:
    s, e = self.cfg.sampling, self.cfg.eval
    # a model folder that ships with the code is read-only: a scale fitted on it is an output
    self.scale_beside = e.fit_uncertainty and shipped.model_folder_of(workdir) is not None
    from cdeit_jax.common import tracking

    logs_to_wandb = any(k.startswith("wandb.") for k in self.overrides)
    if logs_to_wandb or fileio.path(fileio.join(workdir, tracking.RUN_FILE)).exists():
      tracking.check_mode_env()  # it will log to W&B: WANDB_MODE checked before any work
    if self.primary:
      names = outputs.OUTPUTS + ((run_opening.UNCERTAINTY_FILE,) if self.scale_beside else ())
      outputs.check_out(self.out, self.data_path, workdir, names)
      logs.debug_log(self.out)
    if e.fit_uncertainty and (not self.kind.fits_uncertainty or s.num_samples < 2):
      raise InputError(
        "--config.eval.fit_uncertainty=True fits the uncertainty scale on "
        "simulations with several samples: use --data simulated (a validation "
        "split) and --config.sampling.num_samples=8"
      )
    if e.fit_uncertainty and e.calibration is not None:
      raise InputError(
        "--config.eval.fit_uncertainty=True fits a calibration, --config.eval.calibration "
        "applies one: give one of them"
      )

  def _open_data(self, opened: run_opening.Opened) -> None:
    """The data, conditioned as in training, in the units resolved once, of the device the
    run's frames are of (`opened.frames`: the model's own, or a translated run's device)."""
    e, meta = self.cfg.eval, opened.meta
    self.system, self.frames = opened.system, opened.frames
    self.frames.check_kind(self.kind, self.path)
    self.layout = self.frames.device
    self.units = self.kind.units_of(self.given_units, self.layout, e.voltage_ratio, e.current_ratio)
    sets = self.system.sets
    if not (isinstance(e.removal, int) and 0 <= e.removal < len(sets)):
      raise InputError(
        f"--config.eval.removal={e.removal!r}: this model knows the electrode-removal sets "
        f"0..{len(sets) - 1} (config.simulator.removals={self.cfg.simulator.removals!r})"
      )
    self.removed = self.frames.removed(self.system.removed[e.removal])
    self.src = self.open_source(meta, self.system.reads_values)
    self.n = len(self.src) if e.max_examples is None else min(len(self.src), e.max_examples)
    self.check_data()

  def check_data(self) -> None:
    """Data in other units than they are read in are refused before compilation."""
    check_scale(self.src, self.units.name)

  def open_source(self, meta: reader.Meta, vector: bool):
    """The examples (a folder of npz files here; `infer.recording` reads a frames file)."""
    e = self.cfg.eval
    src = sources.NpzSource(
      self.data_path,
      self.units,
      e.stats,
      checkpoint_stats=(meta.mean, meta.std),
      baselines=not self.removed.any(),  # the files' baselines saw every value
      skip_bad=e.skip_bad_files,
      num_values=self.layout.num_values,
      vector_cond=vector,
      removed=self.removed,
    )
    self.statistics = src.statistics  # the checkpoint's, or those --config.eval.stats names
    return src

  def _check_statistics(self, model) -> None:
    c = model.conditioner
    if c is not None and not (
      np.allclose(c.voltage_mean[...], self.src.mean.ravel(), rtol=1e-6, atol=0)
      and np.allclose(c.voltage_std[...], self.src.std.ravel(), rtol=1e-6, atol=0)
    ):
      log.warning(
        f"{self.data_path} is standardised with other statistics than this physics-"
        "informed model was trained with, so its linear input channels are computed "
        "from wrong voltages; leave out --config.eval.stats to use the checkpoint's"
      )

  def _compile(self, model) -> None:
    """The Reconstructor of the run's frames, its sampler compiled for the largest batch that
    fits; its std uncalibrated (the calibration is applied, or fitted, in `finish`)."""
    t0 = time.perf_counter()
    with compile_cache.Watch() as cache:
      self.rec = reconstructor.Reconstructor(
        model,
        self.cfg,
        self.src.mean,
        self.src.std,
        units=self.units,
        mesh=self.mesh,
        num_examples=self.n,
        frames=self.frames,
      )
    self.shape = (*self.rec.shape[:2], 1)  # the answers' images (label units)
    self.k = self.rec.num_samples  # a frame's samples, as its output kind draws them
    self.compile_s, self.cache_hit = time.perf_counter() - t0, cache.hit
    log.info(
      f"sampler (global batch {self.rec.sampler.max_batch}, {self.cfg.sampling.steps} steps) "
      f"{'loaded from the persistent compilation cache' if cache.hit else 'compiled'} in "
      f"{self.compile_s:.1f} s; sampling starts {time.perf_counter() - self.t_start:.1f} s "
      "after the start"
    )

  # --------------------------------------------------------------------------- run

  def staging(self):
    """The outputs' staging folder for `run` and `finish`: published whole by `finish`, removed
    when either fails (process 0; nothing elsewhere)."""
    if not self.primary:
      return contextlib.nullcontext()
    self.staged = outputs.Staged(self.out)
    return outputs.failing(self.staged)

  def run(self) -> None:
    """Every example reconstructed, a chunk of examples at a time (whole global batches:
    batch b holds examples b*G .. b*G+G-1), scored and written as they come in a worker thread
    (memory flat)."""
    g = self.rec.sampler.max_batch
    if self.primary:
      self._open_outputs()
    chunk = g * max(1, CHUNK // g)
    self.sample_s = 0.0
    bar = logs.progress(self.n * self.k, "sampling", "image", enabled=self.primary, mininterval=1.0)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
      pending = None  # one chunk in the worker, one being sampled: memory stays two chunks
      for lo in range(0, self.n, chunk):
        examples = [self.src[i] for i in range(lo, min(self.n, lo + chunk))]
        answer = self._reconstruct(lo, examples, bar)
        if self.primary:
          if pending is not None:
            pending.result()  # its errors are raised here
          pending = worker.submit(self._take_in, lo, examples, answer)
      if pending is not None:
        pending.result()
    bar.close()

  def _open_outputs(self) -> None:
    e = self.cfg.eval
    self.predictions = outputs.Predictions(
      self.staged.work, self.n, self.shape, self.k, self.units.conductivity_factor
    )
    self.baseline_keys = tuple(npz_files.BASELINE_KEYS) if self.src.baselines else ()
    linear = self.linear_baselines(e)
    self.scores = metrics.Scores(tuple(linear) + self.baseline_keys)
    self.calib = None if e.fit_uncertainty else self.calibration  # None: fitted here
    self.extra: list[str] = []  # outputs beyond outputs.OUTPUTS (a scale fitted beside them)
    self.coverage = intervals.Coverage(self.calib) if self.k > 1 else None
    self.linear = linear
    self.shown: dict[str, Any] = {}

  def linear_baselines(self, e) -> dict:
    """{name: reconstruction} of the in-tool linear baselines asked for (--config.eval.tikhonov,
    --config.eval.greit), of the values the removal leaves and the data hold (left out, not
    zeros)."""
    from cdeit_jax.eit import greit, tikhonov

    absent = getattr(self.src, "absent", np.zeros_like(self.removed))
    present = ~(self.removed | absent)
    asked = {"tikhonov": (e.tikhonov, tikhonov.of_values), "greit": (e.greit, greit.of_values)}
    return {k: of_values(self.layout, present) for k, (on, of_values) in asked.items() if on}

  def _reconstruct(self, lo: int, examples: list[dict], bar) -> reconstructor.Reconstruction:
    """The Reconstructor's answers to examples lo .. lo + len (their conditions as the source
    made them), every sample kept."""
    t0 = time.perf_counter()
    answer = self.rec.reconstruct_conditions(
      np.stack([ex["cond"] for ex in examples]),
      first_index=lo,
      keep_samples=True,
      progress=bar.update,
    )
    self.sample_s += time.perf_counter() - t0
    return answer

  def _take_in(self, lo: int, examples: list[dict], answer: reconstructor.Reconstruction) -> None:
    """Score and write examples lo .. lo + len: in a worker thread, while the devices sample
    the next chunk (host work off the hot path)."""
    channel = lambda a: None if a is None else a[..., None]  # as predictions.npz holds them
    pred, std = channel(answer.images), channel(answer.std)
    samples = channel(answer.samples) if answer.samples is not None else pred[None]
    target = np.stack([ex["target"] for ex in examples])
    stored = {k: np.stack([ex[k] for ex in examples])[..., 0] for k in self.baseline_keys}
    if self.linear:
      ys = np.stack([ex["ys"] for ex in examples])
      stored = {**{k: method(ys) for k, method in self.linear.items()}, **stored}
    scaled = self.scores.add(pred[..., 0], target[..., 0], stored)
    if self.coverage is not None:
      self.coverage.add(pred[..., 0], std[..., 0], target[..., 0])
    self.predictions.add(lo, pred, target, std, samples)
    if lo == 0 and self.cfg.eval.figure:  # the figure's examples: the first chunk's
      n = outputs.SHOWN
      self.shown.update(
        target=target[:n],
        pred=pred[:n],
        std=None if std is None else std[:n],
        baselines={k: v[:n] for k, v in scaled.items()},
      )

  # --------------------------------------------------------------------------- finish

  def finish(self) -> dict[str, Any]:
    """metrics.json's content; process 0 also writes every output and publishes them."""
    done = self.n * self.k
    result = {
      "images_per_s": done / self.sample_s,
      "ms_per_image": 1000 * self.sample_s / done,
      "compile_s": self.compile_s,
      "compile_cache_hit": self.cache_hit,
      "devices": jax.device_count(),
      "processes": jax.process_count(),
      "global_batch": self.rec.sampler.max_batch,
    }
    if not self.primary:
      return result
    report, rows = self.scores.result()
    if self.coverage is not None:
      report["uncertainty"] = self._calibrate()
    result.update(
      {"metrics": report, "definitions": metrics.DEFINITIONS, "settings": self._settings()}
    )
    names = [self.src.files[i] for i in range(self.n)]
    outputs.write_outputs(
      self.staged, result, rows, names, self.predictions, self._figure(report), self.extra
    )
    return result

  def _calibrate(self) -> dict[str, float]:
    """The uncertainty's coverage at the kept calibration, or at the one fitted here
    (`intervals.fit`: split-conformal, kept in the step folder, or, for a model folder that
    ships with the code, which is read-only, in the outputs beside metrics.json); the
    predictions' std scaled by its 1-std scale (the uncertainty offered: calibrated)."""
    s, e = self.cfg.sampling, self.cfg.eval
    if e.fit_uncertainty:
      self.calib = self.coverage.fit(tuple(e.interval_levels))
      kept = self.calibration_file
      if self.scale_beside:
        kept = fileio.join(self.staged.work, run_opening.UNCERTAINTY_FILE)
        self.extra.append(run_opening.UNCERTAINTY_FILE)
      record = {
        **self.calib.record(),
        "fitted_on": fileio.resolve(self.data_path),
        "examples": self.n,
        "num_samples": s.num_samples,
        "sampling_steps": s.steps,
        "eta": s.eta,
      }
      fileio.write_text(kept, json.dumps(record, indent=1))
      where = fileio.join(self.out, run_opening.UNCERTAINTY_FILE) if self.scale_beside else kept
      log.info(
        f"uncertainty scales {self.calib.std_scale:.3f} (1 std), "
        f"{self.calib.scale(intervals.TWO_SIGMA):.3f} (2 std) fitted on {self.n} examples, "
        f"kept in {where}"
      )
    self.predictions.scale_std(self.calib.std_scale)
    return self.coverage.result(self.calib)

  def _settings(self) -> dict[str, Any]:
    s, e = self.cfg.sampling, self.cfg.eval
    return {
      "checkpoint": self.workdir,
      "checkpoint_step": self.meta.step,
      "weights": e.weights,
      "data": self.data_name,
      "data_path": fileio.resolve(self.data_path),
      "units": self.units.name,
      "statistics": self.statistics.record(),
      "voltage_ratio": self.units.gain,
      "current_ratio": self.units.current_ratio,
      "sampling_steps": s.steps,
      "eta": s.eta,
      "data_consistency": s.data_consistency,
      "data_consistency_alpha": s.data_consistency_alpha,
      "num_samples": s.num_samples,
      "seed": s.seed,
      "examples": self.n,
      "model": self.meta.record["model"],
      "dtype": self.cfg.model.dtype,
      "config": {"sampling": s.to_dict(), "eval": e.to_dict(), "overrides": self.given_overrides},
    }

  def _figure(self, report: dict[str, Any]) -> dict[str, Any] | None:
    if not self.cfg.eval.figure:
      return None
    shown = self.shown
    figure = {**shown, "baselines": {k: v for k, v in shown["baselines"].items() if k in report}}
    if shown["std"] is not None:
      figure["std"] = shown["std"] * np.float32(self.calib.std_scale)
    return figure
