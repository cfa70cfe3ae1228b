"""The training loop, in phases: the resume plan (which checkpoint, if any, and whether the
config may resume from it: `resume`), the data (`sources`), the compiled step (`training`), the
restore (the newest intact step: `resume`), then the steps, with every periodic action (log
window: `log_windows`, validation, checkpoint, preemption stop: `preemption`) decided by one
small predicate (`Schedule`).

Host work stays off the device's path: metrics are fetched once per log window, checkpoints
are written asynchronously by orbax, and grain prefetches batches in threads or processes.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cdeit_jax import config_lib
from cdeit_jax.checkpoints import checkpoint, loading, shipped, train_checkpoint
from cdeit_jax.common import compat, compile_cache, fileio, logs, tracking
from cdeit_jax.common import sharding as shd
from cdeit_jax.common.errors import CdeitError
from cdeit_jax.data import pipeline, simulator_source, training_data
from cdeit_jax.eit import conditioning
from cdeit_jax.model import flops
from cdeit_jax.train import budget as budget_lib
from cdeit_jax.train import goodput, memory_fit, training, workdir_lock
from cdeit_jax.train.log_windows import Window, eta_s, progress_line
from cdeit_jax.train.preemption import Preemption
from cdeit_jax.train.resume import check_device, plan_resume, restore

log = logs.log.getChild("train")


class Interrupted(CdeitError, KeyboardInterrupt):
  """Ctrl-C: the run saved its step and stopped (the commands exit 130)."""


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
  primary = jax.process_index() == 0
  made = StartupPieces.missing(workdir) if primary else None
  fileio.writable_folder(workdir, "--workdir")
  lock = workdir_lock.WorkdirLock(workdir, lease_s=cfg.lock_lease_s)
  # from before the lock exists: a SIGTERM once it is visible (while starting or compiling)
  # stops the run cleanly and releases it, never kills the process with the lock left behind
  preempt = Preemption()
  clock, refused = goodput.Clock(t0), False
  try:
    if primary:  # one run per workdir (the other processes belong to this run)
      lock.acquire()
    logs.debug_log(workdir, enabled=primary)
    mesh = shd.make_mesh()
    with jax.set_mesh(mesh):  # per-device kernels (splash attention) find the mesh when traced
      result = _train(cfg, workdir, mesh, clock, preempt, lock)
    if preempt.signal == signal.SIGINT:
      done = (
        "during start-up, before step 0 (nothing to save)"
        if result.get("saved") is False
        else f"after step {result['step']}, which is saved"
      )
      raise Interrupted(f"interrupted (Ctrl-C) {done}; rerun the same command to resume")
    return result
  except Exception as e:
    # refused before its first step (bad data, a config the checkpoint refuses, a step that
    # does not fit): it leaves nothing it made (a busy workdir's lock is its holder's)
    refused = clock.steps_t0 is None and not isinstance(e, workdir_lock.WorkdirBusy)
    if isinstance(e, fileio.DiskFull) or not compat.is_disk_full(e):
      raise
    logs.debug.error("the full error behind 'no space left'", exc_info=e)
    raise fileio.no_space(
      workdir, "the steps already saved are whole; rerun the same command to resume from the latest"
    ) from None
  finally:
    preempt.restore()
    lock.release(remove=refused and made is not None and made.lock)
    if refused and made is not None:
      made.remove()


@dataclasses.dataclass
class StartupPieces:
  """What a run's start-up makes in its workdir where nothing was: the folder (and the missing
  folders above it), the lock file, the `checkpoints` folder, `debug.log`. A run refused before
  its first step removes them again, and only them: the user's files, a damaged step set aside,
  a debug log that holds the refusal's whole error, stay."""

  workdir: str
  folders: list[str]  # the missing folders, the workdir first, then each one above it
  lock: bool
  checkpoints: bool
  debug_log: bool

  @classmethod
  def missing(cls, workdir: str) -> StartupPieces:
    there = lambda name: fileio.path(fileio.join(workdir, name)).exists()
    folders = []
    if not fileio.is_remote(workdir):  # an object store has no empty folders to leave
      p = fileio.path(workdir)
      while not p.exists() and p != p.parent:
        folders.append(str(p))
        p = p.parent
    if not fileio.path(workdir).exists():
      return cls(workdir, folders, True, True, True)
    names = (workdir_lock.LOCK_NAME, checkpoint.CHECKPOINTS, logs.DEBUG_LOG)
    return cls(workdir, folders, *(not there(n) for n in names))

  def remove(self) -> None:
    """Remove what start-up made (the lock file: `WorkdirLock.release(remove=True)`), each only
    if it is still empty."""
    try:
      ckpt = fileio.path(fileio.join(self.workdir, checkpoint.CHECKPOINTS))
      if self.checkpoints and ckpt.is_dir() and not any(ckpt.iterdir()):
        ckpt.rmdir()
      debug_log = fileio.path(fileio.join(self.workdir, logs.DEBUG_LOG))
      if self.debug_log and debug_log.exists() and debug_log.stat().length == 0:
        debug_log.unlink()
      for folder in map(fileio.path, self.folders):
        if not folder.is_dir() or any(folder.iterdir()):
          break
        folder.rmdir()
    except OSError as e:  # never in the way of the refusal's own message
      logs.debug.error(f"removing what the refused run made in {self.workdir}: {e}")


# ----------------------------------------------------------------------------- start-up block


def devices_line(cfg: ml_collections.ConfigDict) -> str:
  """The devices and the mesh the step runs over."""
  n, kind = jax.device_count(), jax.devices()[0].device_kind
  params = "split over it (FSDP)" if cfg.shard_params else "replicated"
  return (
    f"devices: {n} x {kind} over {jax.process_count()} process(es); mesh {shd.DATA}={n} "
    f"(the batch split over it, parameters {params})"
  )


def _log_devices(cfg: ml_collections.ConfigDict) -> str:
  """Log the devices line, and the fewer-devices line where it applies; the devices line."""
  devices = devices_line(cfg)
  log.info(devices)
  few = fewer_devices_line(cfg.get("expected_devices"), jax.device_count())
  if few:
    log.warning(few)
  return devices


def fewer_devices_line(expected: int | None, count: int) -> str | None:
  """One line where a config meant for `expected` devices (`config.expected_devices`) runs on
  fewer: what runs is not the data-parallel path it was made for, and how to get as many on a
  CPU."""
  if not expected or count >= expected:
    return None
  return (
    f"this config is meant for {expected} devices (config.expected_devices) and runs on {count}, "
    f"so its batch is not split {expected} ways as there; to check that path on a CPU, run with "
    f"XLA_FLAGS=--xla_force_host_platform_device_count={expected} (docs/training.md)"
  )


def batch_line(cfg: ml_collections.ConfigDict, num_devices: int) -> str:
  """The global batch, per device and per micro-batch."""
  k = cfg.accum_steps
  per_device = cfg.batch_size // (num_devices * k)
  accum = (
    "no gradient accumulation"
    if k == 1
    else f"gradient accumulation over {k} micro-batches of {cfg.batch_size // k}"
  )
  return (
    f"batch: global {cfg.batch_size}, {per_device} per device per micro-batch on "
    f"{num_devices} device(s); {accum}"
  )


def model_line(cfg: ml_collections.ConfigDict, ts: training.Setup) -> str:
  """Parameters (their number and dtype), the compute dtype, attention, remat, FLOPs a step."""
  kw = ts.model_kwargs
  dtypes = "/".join(sorted({str(x.dtype) for x in jax.tree.leaves(ts.state.params)}))
  per_example = flops.train_flops_per_example(kw)
  flop = lambda x: f"{x / 1e12:.4g} TFLOP" if x >= 1e12 else f"{x / 1e9:.4g} GFLOP"
  return (
    f"model: {ts.num_params:,} parameters in {dtypes}, computing in "
    f"{jnp.dtype(kw['dtype']).name} (attention {kw['attention_impl']}, remat "
    f"{'on' if kw.get('remat') else 'off'}); {flop(per_example * cfg.batch_size)} a step "
    f"({flop(per_example / 3)} a forward pass per example, x3 with the backward)"
  )


# ----------------------------------------------------------------------------- phases


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
  devices: str  # the start-up block's devices line (W&B's `device`)


def _prepare(
  cfg: ml_collections.ConfigDict, workdir: str, mesh, mngr, stop: Callable[[], bool]
) -> _Prepared:
  """The resume plan, the data, the model and its compiled step, and the state: fresh, or the
  newest intact step. `stop` may end the data's start-up early (`simulator_source.Stopped`).
  The start-up block (devices, mesh, batch, model) is logged as each part is known."""
  devices = _log_devices(cfg)
  plan = plan_resume(mngr, cfg, workdir)
  system = loading.resolve(cfg)
  device = system.device
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
    cfg, mesh, system, plan.checkpoint_stats, stop, start_stats=inherited[0] if inherited else None
  )
  ts = training.setup(cfg, system, mesh, calibration_source=data.calibration)
  for line in (batch_line(cfg, jax.device_count()), model_line(cfg, ts)):
    log.info(line)
  compiled, cached = compile_step(ts, cfg, mesh)
  how = "loaded from the persistent compilation cache" if cached else "compiled"
  report = [
    f"train step {how} in {compiled.compile_s:.1f} s; "
    f"{memory_fit.train_step_report(compiled.memory, cfg)}",
    data.description,
  ]
  note = conditioning.ignored_note(device, system.current_carrying)
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
      device=ts.system.device.record(),
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
    devices,
  )


def _start(cfg: ml_collections.ConfigDict, workdir: str, mesh, preempt: Preemption):
  """(the checkpoint manager, the prepared run, or None where a signal stopped the data's
  start-up); the manager is closed when start-up fails."""
  mngr = train_checkpoint.train_manager(
    workdir, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoints
  )
  try:
    return mngr, _prepare(cfg, workdir, mesh, mngr, preempt.requested_here)
  except simulator_source.Stopped as e:
    mngr.close()
    log.info(f"a signal during start-up: {e}; nothing was saved; rerun the same command to start")
    return mngr, None
  except BaseException:
    mngr.close()
    raise


def _train(
  cfg: ml_collections.ConfigDict,
  workdir: str,
  mesh,
  clock: goodput.Clock,
  preempt: Preemption,
  lock: workdir_lock.WorkdirLock,
) -> dict[str, Any]:
  primary = jax.process_index() == 0
  mngr, p = _start(cfg, workdir, mesh, preempt)
  if p is None:
    return {"step": 0, "saved": False}
  logger = logs.MetricLogger(workdir, cfg.steps, p.start, enabled=primary)
  for line in p.report:
    log.info(line)
  tracker = tracking.Tracker.start(cfg, workdir, p.devices, p.start, logger.history, primary)
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
        last["eta_s"] = eta_s(step, cfg.steps, p.start, time.perf_counter() - clock.steps_t0)
        logger.write(step, last, advance=window.steps)
        tracker.log(step, last, checkpoint=step if last_good != saved_before else None)
        log.info(progress_line(step, cfg.steps, window.start, last))
        if "run" in last:  # the run's end: its summary after its last progress line
          log.info(goodput.describe(last["run"]))
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
  return last_good, state, out_of_time
