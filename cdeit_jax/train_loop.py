"""The training loop: data, compiled step, validation, checkpoints, logging, preemption.

Host work stays off the device's path: metrics are fetched once per `log_every` steps, checkpoints
are written asynchronously by orbax, and grain prefetches batches in threads or processes.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from cdeit_jax import aot, checkpoint, config_lib, data, fileio, hardware, logs, pipeline
from cdeit_jax import workdir_lock
from cdeit_jax import sharding as shd
from cdeit_jax import simulator_source, training
from cdeit_jax.errors import CdeitError, DoesNotFit

log = logs.log.getChild("train")


class NonFiniteLoss(CdeitError, RuntimeError):
  pass


class _Preemption:
  """Stop at a step every process agrees on after a SIGTERM to any of them.

  One process: a Python SIGTERM handler sets a flag, checked after every step. Several: JAX's
  preemption service (started by `jax.distributed.initialize`) catches SIGTERM itself, tells
  every process through the coordination service and agrees on the next safe step;
  `reached_preemption_sync_point(step)`, called after every step, is a local check (no
  collective, no device sync) that turns true at that same step everywhere. No Python handler
  is installed then: it would replace JAX's and hide the signal from it.
  """

  def __init__(self):
    self.requested = False
    self._multi = jax.process_count() > 1
    self._previous = None if self._multi else signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    self.requested = True

  def agreed(self, step: int) -> bool:
    """Whether to save and stop after `step` (call after every step, on every process)."""
    if not self._multi:
      return self.requested
    return multihost_utils.reached_preemption_sync_point(step)

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def open_sources(cfg: ml_collections.ConfigDict, checkpoint_stats=None):
  """(train, valid) sources; valid uses the training set's statistics."""
  d = cfg.data
  common = dict(voltage_ratio=d.voltage_ratio, current_ratio=d.current_ratio,
                skip_bad=d.skip_bad_files)
  train = data.NpzSource(fileio.join(d.path, d.train_split), d.preset, d.stats,
                         checkpoint_stats=checkpoint_stats, cache=d.cache, **common)
  valid = data.NpzSource(fileio.join(d.path, d.valid_split), d.preset, (train.mean, train.std),
                         cache=d.cache, **common)
  return train, valid


def _memory_report(compiled: training.CompiledStep, cfg: ml_collections.ConfigDict) -> str:
  m = compiled.memory
  if not m:
    return "memory analysis: not reported by this backend"
  gib = lambda b: b / 2 ** 30
  need = m["peak_bytes"]
  text = (f"memory per device: arguments {gib(m.get('argument_size_in_bytes', 0)):.2f} GiB, "
          f"outputs {gib(m.get('output_size_in_bytes', 0)):.2f} GiB (aliased "
          f"{gib(m.get('alias_size_in_bytes', 0)):.2f}), temporaries "
          f"{gib(m.get('temp_size_in_bytes', 0)):.2f} GiB; total ~{gib(need):.2f} GiB")
  stats = jax.local_devices()[0].memory_stats() or {}
  limit = stats.get("bytes_limit")
  if limit:
    text += f" of {gib(limit):.2f} GiB"
    if need > limit:
      raise DoesNotFit(f"{text}\nThe train step will not fit: set "
                        f"{aot.fit_advice(cfg, jax.device_count(), jax.default_backend())}.")
  return text


def train(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Train (or resume) in `workdir`; returns the last logged metrics."""
  config_lib.check_training_config(cfg, jax.device_count(), jax.process_count())
  workdir = fileio.resolve(workdir)
  fileio.makedirs(workdir)
  lock = workdir_lock.WorkdirLock(workdir)
  if jax.process_index() == 0:  # one run per workdir (the other processes belong to this run)
    lock.acquire()
  logs.debug_log(workdir, enabled=jax.process_index() == 0)
  mesh = shd.make_mesh()
  try:
    with jax.set_mesh(mesh):  # per-device kernels (splash attention) find the mesh when traced
      return _train(cfg, workdir, mesh)
  finally:
    lock.release()


# Settings a run cannot resume under: they change the state's shapes or the data order.
_RESUME_FIXED = ("batch_size",)
# Settings that may change on resume, but then the run no longer matches an uninterrupted one.
_RESUME_WARN = ("seed", "steps", "accum_steps", "optimizer", "ema", "diffusion", "data.seed",
                "data.path", "data.train_split", "data.source")


GRAD_NORM_RANGE = (1e-7, 1e3)  # outside it, a step's gradient norm is reported


def unusual_grad_norms(first_step: int, norms: list[float]) -> list[str]:
  """Warnings for the steps of a log window (steps first_step, first_step + 1, ...) whose
  gradient norm lies outside GRAD_NORM_RANGE: every step is checked, so a spike inside the window
  is seen; one line per window, naming the steps (the first few) and the extreme value."""
  lo, hi = GRAD_NORM_RANGE
  bad = [(first_step + i, g) for i, g in enumerate(norms) if not lo <= g <= hi]
  if not bad:
    return []
  steps = ", ".join(str(s) for s, _ in bad[:5]) + (", ..." if len(bad) > 5 else "")
  worst = max(bad, key=lambda sg: abs(np.log10(max(sg[1], 1e-30))))
  return [f"gradient norm outside [{lo:g}, {hi:g}] at {len(bad)} step(s) ({steps}); "
          f"{worst[1]:.3g} at step {worst[0]}"]


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_resume(cfg: ml_collections.ConfigDict, meta: dict, where: str) -> list[str]:
  """Refuse a config the checkpoint cannot resume under; returns warnings for changed settings
  that resume but break equality with an uninterrupted run."""
  now = _flat(json.loads(cfg.to_json_best_effort()))
  was = _flat(meta.get("config", {}))
  changed = lambda keys: [k for k in sorted(set(now) | set(was))
                          if any(k == p or k.startswith(p + ".") for p in keys)
                          and now.get(k) != was.get(k)]
  model = [k for k in changed(("model",))
           if k.split(".", 1)[1] not in checkpoint.RUNTIME_MODEL_KEYS]
  fixed = model + changed(_RESUME_FIXED)
  if fixed:
    diff = "; ".join(f"config.{k}: checkpoint {was.get(k)!r}, now {now.get(k)!r}" for k in fixed)
    raise checkpoint.CheckpointError(
        f"cannot resume from {where} with a changed config ({diff}); rerun with the "
        "checkpoint's settings or give a new --workdir")
  warn = changed(_RESUME_WARN + (("simulator",) if cfg.data.source == "simulator" else ()))
  if cfg.optimizer.schedule == "constant":  # then more steps only extend the same run
    warn = [k for k in warn if k != "steps"]
  return [f"warning: resuming {where} with changed config.{k}: {was.get(k)!r} -> "
          f"{now.get(k)!r} (the run no longer equals an uninterrupted one)" for k in warn]


def _newest_meta(mngr, workdir: str, skipped: dict[int, str]) -> dict | None:
  """The metadata of the newest step whose metadata reads (None in a fresh workdir)."""
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return None
  try:
    return checkpoint.first_readable(workdir, steps, skipped)[1]
  except checkpoint.CheckpointError:
    raise checkpoint.CheckpointError(
        f"no checkpoint in {mngr.directory} can be read:\n  {_reasons(skipped)}\nThe whole errors "
        f"are in {fileio.join(workdir, logs.DEBUG_LOG)}; move the steps away to start afresh"
        ) from None


def _reasons(skipped: dict[int, str]) -> str:
  return "\n  ".join(f"step {step}: {reason}" for step, reason in skipped.items())


def _restore_newest_intact(mngr, state, shardings, host_iter, skipped: dict[int, str]):
  """(state, meta, step, damaged steps) from the newest step that restores completely; steps
  passed over are added to `skipped`."""
  damaged = []
  with logs.StderrCapture() as capture:
    for step in sorted(mngr.all_steps(), reverse=True):
      try:
        restored, meta = checkpoint.restore_train(mngr, step, state, shardings, host_iter)
        return restored, meta, step, damaged
      except checkpoint.CheckpointError as e:
        capture.failed = True
        skipped.setdefault(step, str(e))  # reported once, with the first reason found
        damaged.append(step)
  raise checkpoint.CheckpointError(
      f"no checkpoint in {mngr.directory} restores completely:\n  {_reasons(skipped)}\nThe "
      f"whole errors are in {logs.DEBUG_LOG}; move the steps away to start afresh")


def _set_aside(workdir: str, steps: list[int]) -> list[str]:
  """Move damaged step folders to `<workdir>/damaged/` (kept for inspection, out of orbax's way
  so that the step can be written again)."""
  moved = []
  if jax.process_index() == 0:
    for step in steps:
      target = fileio.join(workdir, "damaged", f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
      fileio.move(fileio.join(workdir, checkpoint.CHECKPOINTS, str(step)), target)
      moved.append(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("cdeit_jax damaged checkpoints moved")
  return moved


def _train(cfg: ml_collections.ConfigDict, workdir: str, mesh) -> dict[str, Any]:
  primary = jax.process_index() == 0
  mngr = checkpoint.train_manager(workdir, keep=cfg.keep_checkpoints,
                                  async_save=cfg.async_checkpoints)
  report: list[str] = []
  skipped: dict[int, str] = {}  # unreadable steps: {step: reason}
  newest = _newest_meta(mngr, workdir, skipped)
  if newest is not None:
    if newest.get("format") == checkpoint.FORMAT_V1:
      raise checkpoint.CheckpointError(
          f"{mngr.directory} was written by cdeit-jax 0.1 ({checkpoint.FORMAT_V1}); training "
          "cannot resume from it: start a new --workdir (eval.py still reads it)")
    report += check_resume(cfg, newest, f"{mngr.directory}/{newest['step']}")
  ck_stats = checkpoint.meta_stats(newest) if newest is not None else None
  simulated = cfg.data.source == "simulator"
  if simulated:  # the statistics' and validation examples, made on the devices now
    t0 = time.perf_counter()
    train_src, valid_src = simulator_source.open_sources(cfg, mesh, ck_stats)
    made = (f"{len(train_src)} statistics and" if ck_stats is None else
            "statistics from the checkpoint,")
    report.append(f"simulator source: {made} {len(valid_src)} validation examples made in "
                  f"{time.perf_counter() - t0:.1f} s")
  else:
    train_src, valid_src = open_sources(cfg, ck_stats)

  ts = training.setup(cfg, mesh, calibration_source=train_src if newest is None else None)
  graphdef, state, diffusion, num_params = ts.graphdef, ts.state, ts.diffusion, ts.num_params
  try:
    compiled = training.compile_train_step(ts, cfg.batch_size, mesh, cfg.shard_params)
  except jax.errors.JaxRuntimeError as e:
    if not aot.is_out_of_memory(e):
      raise
    raise DoesNotFit(
        f"the train step does not fit the devices' memory ({str(e).splitlines()[0][:200]}). "
        f"Set {aot.fit_advice(cfg, jax.device_count(), jax.default_backend())}. Check a "
        "config without the hardware: train.py --compile_topology v5e-8 (TPU).") from None
  report = [f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} over "
            f"{jax.process_count()} process(es); global batch {cfg.batch_size} "
            f"({cfg.accum_steps} micro-batches); params {num_params:,}",
            f"train step compiled in {compiled.compile_s:.1f} s; {_memory_report(compiled, cfg)}"
            ] + report
  if simulated:  # each step's batch is made on the devices from the step number
    host_iter = None
    simulated_batch = simulator_source.batch_fn(cfg, mesh, train_src.mean, train_src.std)
  else:
    host_iter = pipeline.train_dataset(train_src, cfg.batch_size, cfg.data).__iter__()
  rng = jax.random.key(cfg.seed)
  state = jax.device_put(state, compiled.state_shardings)
  constants = ts.constants
  latest = None
  if newest is not None:
    state, meta, latest, damaged = _restore_newest_intact(mngr, state, compiled.state_shardings,
                                                          host_iter, skipped)
    checkpoint.set_calibration(constants, meta.get("calibration", {}))
    report += [f"skipping checkpoint step {step}: {reason}" for step, reason in skipped.items()]
    rng = jax.random.wrap_key_data(jnp.asarray(meta["rng"], jnp.uint32))
    if damaged:
      mngr.close()
      for path in _set_aside(workdir, damaged):
        report.append(f"moved damaged checkpoint to {path}")
      mngr = checkpoint.train_manager(workdir, keep=cfg.keep_checkpoints,
                                      async_save=cfg.async_checkpoints)
    report.append(f"resumed from {mngr.directory}/{latest}")
  start = int(jax.device_get(state.step))
  constants = jax.device_put(constants, compiled.constants_shardings)

  eval_step = jax.jit(training.make_eval_step(graphdef, diffusion),
                      in_shardings=(compiled.state_shardings.ema, compiled.constants_shardings,
                                    shd.batch_sharded(mesh), shd.replicated(mesh)),
                      out_shardings=shd.replicated(mesh))
  eval_batch = cfg.eval_batch_size or cfg.batch_size

  def validation_loss(params) -> float:
    total, count = [], []
    base = jax.random.key(cfg.eval_seed)
    for i, b in enumerate(pipeline.eval_batches(valid_src, eval_batch)):
      if cfg.eval_max_batches and i >= cfg.eval_max_batches:
        break
      g = pipeline.to_global(b, mesh)
      s, c = eval_step(params, constants, g, jax.random.fold_in(base, i))
      total.append(s)
      count.append(c)
    return float(sum(jax.device_get(total))) / max(float(sum(jax.device_get(count))), 1.0)

  calibration = checkpoint.calibration_of(constants)

  def meta_now(step: int) -> dict:
    return checkpoint.make_meta(cfg, step=step, mean=train_src.mean, std=train_src.std,
                                weights=["ema", "raw"], source="train.py", calibration=calibration,
                                rng=np.asarray(jax.random.key_data(rng)).tolist())

  logger = logs.MetricLogger(workdir, cfg.steps, start, enabled=primary)
  for line in report:
    (log.warning if line.startswith(("warning: ", "skipping ")) else log.info)(
        line.removeprefix("warning: "))
  if primary and logger.dropped:
    log.info(f"metrics.jsonl: dropped {logger.dropped} record(s) after step {start} (steps "
                 "an earlier attempt logged but did not commit)")
  peak = hardware.peak_tflops()
  preempt = _Preemption()
  pending: list[dict] = []
  window_start, window_t = start, time.perf_counter()
  last_good = latest
  last: dict[str, Any] = {}
  step = start
  try:
    while step < cfg.steps:
      if host_iter is None:
        batch = simulated_batch(state.step)
      else:
        host_batch = next(host_iter)  # the step needs cond and target only (not the indices)
        batch = pipeline.to_global({k: host_batch[k] for k in ("cond", "target")}, mesh)
      state, metrics = compiled.fn(state, batch, rng, constants)
      pending.append(metrics)
      step += 1
      final = step == cfg.steps
      boundary = step % cfg.log_every == 0 or step % cfg.eval_every == 0 or final
      stop = preempt.agreed(step)
      if not (boundary or stop):
        continue
      # --- one host sync per window: fetch the window's metrics
      host = jax.device_get(pending)
      pending = []
      now = time.perf_counter()
      if not all(bool(m["finite"]) for m in host):
        bad = window_start + 1 + next(i for i, m in enumerate(host) if not bool(m["finite"]))
        raise NonFiniteLoss(
            f"the loss or gradient became non-finite at step {bad}; stopping without saving. "
            f"The last good checkpoint is step {last_good} in {workdir}/checkpoints "
            "(lower config.optimizer.lr, check config.optimizer.grad_clip and the data).")
      n = step - window_start
      sps = n / (now - window_t)
      loss = float(np.mean([m["loss"] for m in host]))
      norms = [float(m["grad_norm"]) for m in host]
      gnorm = norms[-1]
      last = {"loss": loss, "grad_norm": gnorm, "grad_norm_max": max(norms),
              "lr": float(host[-1]["lr"]),
              "steps_per_sec": sps, "samples_per_sec": sps * cfg.batch_size,
              "samples_per_sec_per_device": sps * cfg.batch_size / jax.device_count()}
      per_device = compiled.flops_per_step / jax.device_count() * sps / 1e12
      last["tflops_per_device"] = per_device
      if peak:
        last["fraction_of_peak"] = per_device / peak
      for line in unusual_grad_norms(window_start + 1, norms):
        log.warning(line)
      val_loss = None
      if step % cfg.eval_every == 0 or final:
        val_loss = validation_loss(state.ema)
        last["val_loss"] = val_loss
      if step % cfg.eval_every == 0 or final or stop:
        checkpoint.save_train(mngr, state, host_iter, meta_now(step), val_loss)
        last_good = step
      logger.write(step, last, advance=n)
      window_start, window_t = step, time.perf_counter()
      if stop and not final:
        log.info(f"SIGTERM: saved step {step}; rerun the same command to resume")
        break
  finally:
    mngr.wait_until_finished()
    mngr.close()
    preempt.restore()
    logger.close()
  return dict(last, step=step)
