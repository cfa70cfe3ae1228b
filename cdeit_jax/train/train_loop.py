"""The training loop, in phases: the resume plan (which checkpoint, if any, and whether the
config may resume from it), the data (`sources`), the compiled step (`training`), the restore
(the newest intact step), then the steps, with every periodic action (log window, validation,
checkpoint, preemption stop) decided by one small predicate (`Schedule`).

Host work stays off the device's path: metrics are fetched once per log window, checkpoints
are written asynchronously by orbax, and grain prefetches batches in threads or processes.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, shipped, train_checkpoint
from cdeit_jax.common import compat, compile_cache, fileio, hardware, logs, tracking
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import CdeitError
from cdeit_jax.data import pipeline, simulator_source, training_data
from cdeit_jax.eit import conditioning
from cdeit_jax.train import budget as budget_lib
from cdeit_jax.train import goodput, memory_fit, training, workdir_lock

log = logs.log.getChild("train")


class NonFiniteLoss(CdeitError, RuntimeError):
  pass


class Interrupted(CdeitError, KeyboardInterrupt):
  """Ctrl-C: the run saved its step and stopped (the commands exit 130)."""


class _Preemption:
  """Stop at a step every process agrees on after a SIGTERM to any of them.

  One process: a Python handler of SIGTERM and of a first Ctrl-C (SIGINT; a second one
  interrupts at once) sets a flag, checked after every step, so an interrupted run saves its
  step like a preempted one instead of stopping inside a save. Several: JAX's
  preemption service (started by `jax.distributed.initialize`) catches SIGTERM itself, tells
  every process through the coordination service and agrees on the next safe step;
  `reached_preemption_sync_point(step)`, called after every step, is a local check (no
  collective, no device sync) that turns true at that same step everywhere. No Python handler
  is installed then: it would replace JAX's and hide the signal from it.
  """

  def __init__(self):
    self.requested, self.signal = False, None
    self._multi = jax.process_count() > 1
    self._previous = (
      {}
      if self._multi
      else {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
    )

  def _handle(self, signum, frame):
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: at once
    self.requested, self.signal = True, signum

  def requested_here(self) -> bool:
    """A signal to this process before the steps (checked by long start-up work: the simulator's
    statistics). Always False with several processes, whose start-up work is collective: they
    stop together at the first step's sync point instead."""
    return self.requested and not self._multi

  def agreed(self, step: int) -> bool:
    """Whether to save and stop after `step` (call after every step, on every process)."""
    if not self._multi:
      return self.requested
    return multihost_utils.reached_preemption_sync_point(step)

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def train(
  cfg: ml_collections.ConfigDict, workdir: str, started: float | None = None
) -> dict[str, Any]:
  """Train (or resume) in `workdir`; returns the last logged metrics. `started`: when the
  command started (`time.perf_counter()`), what start-up time and `config.time_budget_s` count
  from (default: now)."""
  t0 = time.perf_counter() if started is None else started
  config_lib.check_training_config(cfg, jax.device_count(), jax.process_count())
  tracking.settings(cfg)  # W&B's environment (WANDB_MODE) checked before any work
  workdir = fileio.resolve(workdir)
  shipped.refuse_write(workdir, "--workdir")  # at any depth: the model's own checkpoints too
  fileio.writable_folder(workdir, "--workdir")
  lock = workdir_lock.WorkdirLock(workdir, lease_s=cfg.lock_lease_s)
  # from before the lock exists: a SIGTERM once it is visible (while starting or compiling)
  # stops the run cleanly and releases it, never kills the process with the lock left behind
  preempt = _Preemption()
  try:
    if jax.process_index() == 0:  # one run per workdir (the other processes belong to this run)
      lock.acquire()
    logs.debug_log(workdir, enabled=jax.process_index() == 0)
    mesh = shd.make_mesh()
    with jax.set_mesh(mesh):  # per-device kernels (splash attention) find the mesh when traced
      result = _train(cfg, workdir, mesh, goodput.Clock(t0), preempt, lock)
    if preempt.signal == signal.SIGINT:
      done = (
        "during start-up, before step 0 (nothing to save)"
        if result.get("saved") is False
        else f"after step {result['step']}, which is saved"
      )
      raise Interrupted(f"interrupted (Ctrl-C) {done}; rerun the same command to resume")
    return result
  except Exception as e:
    if isinstance(e, fileio.DiskFull) or not compat.is_disk_full(e):
      raise
    logs.debug.error("the full error behind 'no space left'", exc_info=e)
    raise fileio.no_space(
      workdir, "the steps saved before are whole; rerun the same command to resume from the latest"
    ) from None
  finally:
    preempt.restore()
    lock.release()


# Settings a run cannot resume under: they change the state's shapes or the data order.
_RESUME_FIXED = ("batch_size",)
# Settings that may change on resume, but then the run no longer matches an uninterrupted one.
_RESUME_WARN = (
  "seed",
  "steps",
  "accum_steps",
  "optimizer",
  "ema",
  "diffusion",
  "data.seed",
  "data.path",
  "data.train_split",
  "data.source",
)


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
  changed = lambda keys: [
    k
    for k in sorted(set(now) | set(was))
    if any(k == p or k.startswith(p + ".") for p in keys) and now.get(k) != was.get(k)
  ]
  model = [k for k in changed(("model",)) if k.split(".", 1)[1] not in loading.RUNTIME_MODEL_KEYS]
  fixed = model + changed(_RESUME_FIXED)
  if fixed:
    diff = "; ".join(f"config.{k}: checkpoint {was.get(k)!r}, now {now.get(k)!r}" for k in fixed)
    raise checkpoint.CheckpointError(
      f"cannot resume from {where} with a changed config ({diff}); rerun with the "
      "checkpoint's settings or give a new --workdir"
    )
  warn = changed(_RESUME_WARN + (("simulator",) if cfg.data.source == "simulator" else ()))
  if cfg.optimizer.schedule == "constant":  # then more steps only extend the same run
    warn = [k for k in warn if k != "steps"]
  return [
    f"warning: resuming {where} with changed config.{k}: {was.get(k)!r} -> "
    f"{now.get(k)!r} (the run no longer equals an uninterrupted one)"
    for k in warn
  ]


def check_device(meta: dict, device, where: str) -> None:
  """Refuse to resume when the config's measuring system is not the one the checkpoint was
  trained for (a device file changed or replaced since)."""
  from cdeit_jax.eit import layout

  was = layout.Layout.from_record(meta["device"], f"{where}: its device")
  if not was.same_system(device):
    raise checkpoint.CheckpointError(
      f"cannot resume from {where}: it was trained for {was.describe()}, the config now gives "
      f"{device.describe()} (config.simulator.layout; a device file changed?); give the "
      "device it was trained for, or a new --workdir"
    )


# ----------------------------------------------------------------------------- phases


@dataclasses.dataclass
class ResumePlan:
  """Where the state comes from: None (a new run) or the newest step whose metadata reads."""

  meta: dict | None
  warnings: list[str]
  skipped: dict[int, str]  # unreadable steps passed over: {step: reason}

  @property
  def checkpoint_stats(self):
    return None if self.meta is None else checkpoint.meta_stats(self.meta)


def plan_resume(mngr, cfg: ml_collections.ConfigDict, workdir: str) -> ResumePlan:
  """Read the newest readable step's metadata and check that `cfg` may resume from it."""
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return ResumePlan(None, [], {})
  _, meta, skipped = checkpoint.first_readable(workdir, steps)
  if cfg.steps < int(meta["step"]):
    raise checkpoint.CheckpointError(
      f"config.steps={cfg.steps} is below the step of {mngr.directory}/{meta['step']}: "
      f"nothing to train; give --config.steps above {meta['step']} to train on, or a new "
      "--workdir"
    )
  return ResumePlan(meta, check_resume(cfg, meta, f"{mngr.directory}/{meta['step']}"), skipped)


def compile_step(
  ts: training.Setup, cfg: ml_collections.ConfigDict, mesh
) -> tuple[training.CompiledStep, bool]:
  """(the train step compiled for `mesh`, whether it came from the persistent compilation
  cache); DoesNotFit, with advice, when memory refuses it."""
  try:
    with compile_cache.Watch() as cache:
      compiled = training.compile_train_step(ts, cfg.batch_size, mesh, cfg.shard_params)
    return compiled, cache.hit
  except jax.errors.JaxRuntimeError as e:
    if not compat.is_out_of_memory(e):
      raise
    raise memory_fit.does_not_fit(e, cfg) from None


def restore(
  mngr, workdir: str, plan: ResumePlan, state, compiled: training.CompiledStep, constants, data_item
) -> tuple[Any, dict, int, list[str], list[str]]:
  """(state, meta, step, warnings, report lines) from the newest step that restores completely,
  the calibration set in `constants`; damaged steps are moved aside (kept for inspection)."""
  load = lambda st: train_checkpoint.restore_train(
    mngr, st, state, compiled.state_shardings, data_item
  )
  steps = sorted(mngr.all_steps(), reverse=True)
  step, (state, meta), skipped = checkpoint.first_intact(
    steps, load, str(mngr.directory), plan.skipped
  )
  checkpoint.set_calibration(constants, meta.get("calibration", {}))
  warnings = [f"skipping checkpoint step {st}: {reason}" for st, reason in skipped.items()]
  report = []
  damaged = [st for st in steps if st > step]  # each failed to restore
  if damaged:
    report += [f"moved damaged checkpoint to {path}" for path in _set_aside(workdir, damaged)]
    mngr.reload()  # the manager forgets the steps moved away
  report.append(f"resumed from {mngr.directory}/{step}")
  return state, meta, step, warnings, report


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


class Schedule:
  """Which periodic actions happen after a step: one predicate, so each is found here. `first`:
  under a time budget, this invocation's first log step, which validates and saves so that the
  cost of the final validation and checkpoint is measured (`train.budget`); `end`: the budget
  ends the run at this step (validated and saved, as the last step is)."""

  def __init__(self, cfg: ml_collections.ConfigDict, first: int | None = None):
    self.log_every, self.eval_every, self.last = cfg.log_every, cfg.eval_every, cfg.steps
    self.first = first

  def validate(self, step: int, end: bool = False) -> bool:
    return step % self.eval_every == 0 or step == self.last or step == self.first or end

  def save(self, step: int, stop: bool, end: bool = False) -> bool:
    return self.validate(step, end) or stop

  def log(self, step: int, stop: bool) -> bool:
    """The end of a log window (metrics fetched): any action ends one."""
    return step % self.log_every == 0 or self.save(step, stop)


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
  return [
    f"gradient norm outside [{lo:g}, {hi:g}] at {len(bad)} step(s) ({steps}); "
    f"{worst[1]:.3g} at step {worst[0]}"
  ]


class Window:
  """The device metrics of the steps since the last log, fetched once at the window's end."""

  def __init__(self, start: int, batch_size: int, flops_per_step: float):
    self.batch_size, self.flops_per_step = batch_size, flops_per_step
    self.peak = hardware.peak_tflops()
    self.start, self.t0, self.pending = start, time.perf_counter(), []

  def add(self, metrics: dict) -> None:
    self.pending.append(metrics)

  def close(self, step: int, last_good: int | None, workdir: str) -> dict[str, Any]:
    """The window's statistics (one host sync); NonFiniteLoss at a non-finite step."""
    host = jax.device_get(self.pending)
    now = time.perf_counter()
    if not all(bool(m["finite"]) for m in host):
      bad = self.start + 1 + next(i for i, m in enumerate(host) if not bool(m["finite"]))
      raise NonFiniteLoss(
        f"the loss or gradient became non-finite at step {bad}; stopping without saving. "
        f"The last good checkpoint is step {last_good} in {workdir}/checkpoints "
        "(lower config.optimizer.lr, check config.optimizer.grad_clip and the data)."
      )
    n, batch, devices = step - self.start, self.batch_size, jax.device_count()
    self.seconds = now - self.t0
    sps = n / self.seconds
    norms = [float(m["grad_norm"]) for m in host]
    out = {
      "loss": float(np.mean([m["loss"] for m in host])),
      "grad_norm": norms[-1],
      "grad_norm_max": max(norms),
      "lr": float(host[-1]["lr"]),
      "steps_per_sec": sps,
      "samples_per_sec": sps * batch,
      "samples_per_sec_per_device": sps * batch / devices,
      "tflops_per_device": self.flops_per_step / devices * sps / 1e12,
    }
    if self.peak:
      out["fraction_of_peak"] = out["tflops_per_device"] / self.peak
    for line in unusual_grad_norms(self.start + 1, norms):
      log.warning(line)
    self.steps = n
    return out

  def reset(self, step: int) -> None:
    self.start, self.t0, self.pending = step, time.perf_counter(), []


def make_validation(
  graphdef,
  diffusion,
  compiled: training.CompiledStep,
  constants,
  valid,
  cfg: ml_collections.ConfigDict,
  mesh,
):
  """`params -> validation loss` (mean L1 of x0 over the validation examples, fixed seed)."""
  eval_step = jax.jit(
    training.make_eval_step(graphdef, diffusion),
    in_shardings=(
      compiled.state_shardings.ema,
      compiled.constants_shardings,
      shd.batch_sharded(mesh),
      shd.replicated(mesh),
    ),
    out_shardings=shd.replicated(mesh),
  )
  eval_batch = cfg.eval_batch_size or cfg.batch_size

  def validation_loss(params) -> float:
    total, count = [], []
    base = jax.random.key(cfg.eval_seed)
    for i, b in enumerate(pipeline.eval_batches(valid, eval_batch)):
      if cfg.eval_max_batches and i >= cfg.eval_max_batches:
        break
      s, c = eval_step(params, constants, pipeline.to_global(b, mesh), jax.random.fold_in(base, i))
      total.append(s)
      count.append(c)
    return float(sum(jax.device_get(total))) / max(float(sum(jax.device_get(count))), 1.0)

  return validation_loss


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class _Prepared:
  """What the steps start from: the data, the compiled step, the state (fresh or restored) and
  what start-up has to say."""

  data: Any
  compiled: training.CompiledStep
  state: Any
  constants: Any
  rng: Any
  start: int
  last_good: int | None
  validation_loss: Callable
  meta_now: Callable[[int], dict]
  report: list[str]
  warnings: list[str]


def _prepare(
  cfg: ml_collections.ConfigDict, workdir: str, mesh, mngr, stop: Callable[[], bool]
) -> _Prepared:
  """The resume plan, the data, the model and its compiled step, and the state: fresh, or the
  newest intact step. `stop` may end the data's start-up early (`simulator_source.Stopped`)."""
  plan = plan_resume(mngr, cfg, workdir)
  device = loading.resolve(cfg).device
  if plan.meta is not None:
    check_device(plan.meta, device, f"{mngr.directory}/{plan.meta['step']}")
  # a fine-tuning's start: the step config.init_from names now, resolved once and recorded in
  # every step (a start that trains on meanwhile is not mixed later: checkpoints.interpolate)
  origin = plan.meta.get("init_from") if plan.meta is not None else None
  if plan.meta is None and cfg.init_from:
    origin = loading.start_of(cfg.init_from)
  origin_path = None
  if origin is not None:
    origin_path = fileio.join(origin["workdir"], checkpoint.CHECKPOINTS, str(origin["step"]))
  inherited = None  # a fine-tuning on its start's system reads its inputs as the start did
  if plan.meta is None and cfg.init_from and cfg.data.get("stats") is None:
    inherited = loading.start_inputs(origin_path, device)
  data = training_data.open_training_data(
    cfg, mesh, device, plan.checkpoint_stats, stop, start_stats=inherited[0] if inherited else None
  )
  ts = training.setup(cfg, mesh, calibration_source=data.calibration, device=device)
  compiled, cached = compile_step(ts, cfg, mesh)
  how = "loaded from the persistent compilation cache" if cached else "compiled"
  report = [
    f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} over "
    f"{jax.process_count()} process(es); global batch {cfg.batch_size} "
    f"({cfg.accum_steps} micro-batches); params {ts.num_params:,}",
    f"train step {how} in {compiled.compile_s:.1f} s; "
    f"{memory_fit.train_step_report(compiled.memory, cfg)}",
    data.description,
  ]
  note = conditioning.ignored_note(device, cfg.model.get("current_carrying", "use"))
  if note:
    report.append(note)
  warnings = list(plan.warnings)
  state = jax.device_put(ts.state, compiled.state_shardings)
  constants, rng, last_good = ts.constants, jax.random.key(cfg.seed), None
  if plan.meta is None and cfg.init_from:
    params, line = loading.initial_params(
      origin_path, cfg, state.params, compiled.state_shardings.params
    )
    state = state.replace(params=params, ema=jax.tree.map(jnp.copy, params))
    report.append(line)
    if inherited is not None:
      checkpoint.set_calibration(constants, inherited[1], prefix=True)
      report.append(
        "its voltage statistics and condition calibration kept (the same measuring system)"
      )
  if plan.meta is not None:
    state, meta, last_good, skipped, lines = restore(
      mngr, workdir, plan, state, compiled, constants, data.checkpoint_item
    )
    warnings += skipped
    report += lines
    rng = jax.random.wrap_key_data(jnp.asarray(meta["rng"], jnp.uint32))
    if cfg.time_budget_s is None:  # the schedule ends at this run's config.steps (a budget
      # re-estimates the restored horizon at its first window)
      state = training.with_horizon(state, training.default_horizon(cfg))
  start = int(jax.device_get(state.step))
  constants = jax.device_put(constants, compiled.constants_shardings)
  validation_loss = make_validation(
    ts.graphdef, ts.diffusion, compiled, constants, data.valid, cfg, mesh
  )
  calibration = checkpoint.calibration_of(constants)

  def meta_now(step: int) -> dict:
    return checkpoint.make_meta(
      cfg,
      step=step,
      mean=data.mean,
      std=data.std,
      weights=["ema", "raw"],
      source="train.py",
      calibration=calibration,
      device=ts.device.record(),
      rng=np.asarray(jax.random.key_data(rng)).tolist(),
      **({"init_from": origin} if origin is not None else {}),
    )

  return _Prepared(
    data,
    compiled,
    state,
    constants,
    rng,
    start,
    last_good,
    validation_loss,
    meta_now,
    report,
    warnings,
  )


def _train(
  cfg: ml_collections.ConfigDict,
  workdir: str,
  mesh,
  clock: goodput.Clock,
  preempt: _Preemption,
  lock: workdir_lock.WorkdirLock,
) -> dict[str, Any]:
  primary = jax.process_index() == 0
  mngr = train_checkpoint.train_manager(
    workdir, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoints
  )
  try:
    p = _prepare(cfg, workdir, mesh, mngr, preempt.requested_here)
  except simulator_source.Stopped as e:
    log.info(f"a signal during start-up: {e}; nothing was saved; rerun the same command to start")
    return {"step": 0, "saved": False}
  logger = logs.MetricLogger(workdir, cfg.steps, p.start, enabled=primary)
  for line in p.report:
    log.info(line)
  tracker = tracking.Tracker.start(cfg, workdir, p.report[0], p.start, logger.history, primary)
  for line in p.warnings:
    log.warning(line.removeprefix("warning: "))
  if primary and logger.dropped:
    log.info(
      f"metrics.jsonl: dropped {logger.dropped} record(s) after step {p.start} (steps "
      "an earlier attempt logged but did not commit)"
    )

  # --- steps, and the periodic actions (each timed by phase, see goodput)
  budget, schedule, window, profiler = _periodic(cfg, p.start, p.compiled, workdir, clock, primary)
  last: dict[str, Any] = {}
  step, state, last_good = p.start, p.state, p.last_good
  clock.steps_begin(p.compiled.compile_s)
  if budget is not None:
    budget.begin(step, time.perf_counter())
  try:
    if step < cfg.steps and preempt.agreed(step):
      log.info(
        f"stopping before step {step} (a signal during start-up); rerun the same command to resume"
      )
      return dict(last, step=step)
    while step < cfg.steps:
      profiler.before_step(step)
      with clock.phase("data"):
        batch = p.data.batch(state.step)
      with clock.phase("step", step=step):
        state, metrics = p.compiled.fn(state, batch, p.rng, p.constants)
      window.add(metrics)
      step += 1
      profiler.after_step(step, state)
      stop = preempt.agreed(step)
      expired = budget is not None and budget.expired(time.perf_counter())
      if not schedule.log(step, stop or expired):
        continue
      with clock.phase("step"):  # the one host sync of the window: waits for its steps
        last = window.close(step, last_good, workdir)
      saved_before = last_good
      last_good, state, out_of_time = _close_window(
        cfg,
        step,
        stop,
        state,
        last,
        last_good,
        p,
        schedule,
        mngr,
        clock,
        lock,
        primary,
        budget,
        window.seconds,
        expired,
      )
      with clock.phase("logging"):
        logger.write(step, last, advance=window.steps)
        tracker.log(step, last, checkpoint=step if last_good != saved_before else None)
      window.reset(step)
      if out_of_time:
        log.info(
          f"config.time_budget_s={cfg.time_budget_s:g} s: step {step} validated and saved "
          f"{time.perf_counter() - clock.t0:.1f} s after the start; rerun to resume (its budget)"
        )
        break
      if stop and step < cfg.steps:
        if preempt.signal != signal.SIGINT:  # Ctrl-C: said once the run has stopped
          log.info(f"SIGTERM: saved step {step}; rerun the same command to resume")
        break
  finally:
    profiler.stop()
    mngr.wait_until_finished()
    mngr.close()
    logger.close()
    tracker.finish()
  return dict(last, step=step)


def _periodic(cfg, start: int, compiled, workdir: str, clock: goodput.Clock, primary: bool):
  """(budget or None, schedule, log window, profiler) of the steps from `start`."""
  budget = None
  if cfg.time_budget_s is not None:
    budget = budget_lib.Budget(cfg.time_budget_s, clock.t0, cfg.steps)
  first_log = (start // cfg.log_every + 1) * cfg.log_every if budget is not None else None
  profiler = goodput.Profiler(cfg.profile, workdir, clock)
  first = cfg.profile.start_step
  if primary and first is not None and not start <= first < cfg.steps:
    log.warning(
      f"config.profile.start_step={first} is outside this run's steps {start}..{cfg.steps - 1}:"
      " no profile is written"
    )
  window = Window(start, cfg.batch_size, compiled.flops_per_step)
  return budget, Schedule(cfg, first=first_log), window, profiler


def _close_window(
  cfg,
  step: int,
  stop: bool,
  state,
  last: dict[str, Any],
  last_good: int | None,
  p: _Prepared,
  schedule: Schedule,
  mngr,
  clock: goodput.Clock,
  lock: workdir_lock.WorkdirLock,
  primary: bool,
  budget: budget_lib.Budget | None = None,
  window_s: float = 0.0,
  expired: bool = False,
):
  """The periodic work at a logging step, into `last`: the lease check, validation, the
  checkpoint, under a time budget its decision, the goodput split. Returns (the newest saved
  step, the state, whether the budget ends the run here). The scheduled validation and
  checkpoint come first, so that the budget decides knowing what they cost (it is told); when it
  ends the run here (or `expired`, one process's check after the step), this step is validated and
  saved, as the last step of a run is, and otherwise the schedule's horizon is set."""
  if primary:
    lock.check()  # a gs:// lease this run can no longer prove: stop before any write
  out_of_time = expired and step < cfg.steps
  t0 = time.perf_counter()

  def validate():
    with clock.phase("validation"):
      last["val_loss"] = p.validation_loss(state.ema)

  def save(end: bool):
    with clock.phase("checkpoint"):
      if primary:
        lock.check(read=True)  # the commit and the retention deletes are the lease's
      train_checkpoint.save_train(
        mngr, state, p.data.checkpoint_item, p.meta_now(step), last.get("val_loss")
      )
      if end:  # the last save is part of the run
        mngr.wait_until_finished()

  if schedule.validate(step, out_of_time):
    validate()
  saved = schedule.save(step, stop, out_of_time)
  if saved:
    save(step == cfg.steps or stop or out_of_time)
    last_good = step
    if budget is not None and "val_loss" in last:
      budget.ended_window(time.perf_counter() - t0)
  if budget is not None:  # stop now, or the horizon for the steps after this
    decision = budget.decide(step, time.perf_counter(), window_s)
    if decision.stop and step < cfg.steps and not out_of_time:
      out_of_time = True
      if "val_loss" not in last:
        validate()
      if saved:
        with clock.phase("checkpoint"):
          mngr.wait_until_finished()
      else:
        save(True)
        last_good = step
    elif not out_of_time:
      state = training.with_horizon(state, decision.horizon)
      budget.horizon = decision.horizon
    # the horizon in force (at a stop: the one its last steps ran under; None: not yet set)
    last.update(horizon=budget.horizon, budget_left_s=round(decision.seconds_left, 1))
  end = step == cfg.steps or stop or out_of_time
  last.update(clock.window_split())
  if end:
    last["run"] = clock.totals()
    log.info(goodput.describe(last["run"]))
  return last_good, state, out_of_time
