"""Where a training run's wall time goes, without a per-step host sync: a clock of host phases
(step, data wait, validation, checkpoint, logging) per log window and for the run, with start-up
and compilation beside them and goodput = productive step time / wall time; and a profiler trace
of chosen steps (XProf / TensorBoard's profile plugin, Perfetto), annotated by phase.

The step phase is the host's time dispatching steps and waiting for the window's results (one
fetch per window), so with asynchronous dispatch it is the device's step time as the host sees
it; time the host spends elsewhere while the devices compute shows in that phase instead.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import jax

from cdeit_jax.common import fileio, logs

PHASES = ("step", "data", "validation", "checkpoint", "logging", "profile")
log = logs.log.getChild("train")


class Clock:
  """Host wall time by phase, per log window and since the run started (`t0`)."""

  def __init__(self, t0: float):
    self.t0 = t0
    self.run = dict.fromkeys(("startup", "compile", *PHASES), 0.0)
    self.window = dict.fromkeys(PHASES, 0.0)
    self.window_t0 = time.perf_counter()
    self.steps_t0: float | None = None  # when the steps began (None: still starting up)

  def add(self, phase: str, seconds: float) -> None:
    self.run[phase] += seconds
    if phase in self.window:
      self.window[phase] += seconds

  @contextlib.contextmanager
  def phase(self, name: str, step: int | None = None):
    """Time a phase, annotated in a profiler trace (a step marker for `step`)."""
    annotation = (
      jax.profiler.StepTraceAnnotation("train", step_num=step)
      if step is not None
      else jax.profiler.TraceAnnotation(name)
    )
    t = time.perf_counter()
    try:
      with annotation:
        yield
    finally:
      self.add(name, time.perf_counter() - t)

  def steps_begin(self, compile_s: float) -> None:
    """The steps start now: what came before is start-up (restore, statistics, calibration)
    and compilation."""
    log.info(
      f"first step after {time.perf_counter() - self.t0:.1f} s (start-up "
      f"{time.perf_counter() - self.t0 - compile_s:.1f} s, compilation {compile_s:.1f} s)"
    )
    now = time.perf_counter()  # the line above is start-up too, not the first window's
    self.add("compile", compile_s)
    self.add("startup", now - self.t0 - compile_s)
    self.window_t0 = self.steps_t0 = now

  def window_split(self) -> dict[str, float]:
    """The window's wall time by phase (`time_<phase>_s`, `time_other_s` the rest) and
    `window_s`; starts the next window."""
    now = time.perf_counter()
    wall = now - self.window_t0
    out = {f"time_{k}_s": v for k, v in self.window.items()}
    out["time_other_s"] = wall - sum(self.window.values())
    out["window_s"] = wall
    self.window = dict.fromkeys(PHASES, 0.0)
    self.window_t0 = now
    return out

  def totals(self) -> dict[str, float]:
    """The run so far: wall time, each part (`other_s` the unmeasured rest) and goodput."""
    wall = time.perf_counter() - self.t0
    out = {"wall_s": wall, **{f"{k}_s": v for k, v in self.run.items()}}
    out["other_s"] = wall - sum(self.run.values())
    out["goodput"] = self.run["step"] / wall if wall > 0 else 0.0
    return out


def describe(t: dict[str, float]) -> str:
  """The end-of-run line."""
  parts = ", ".join(
    f"{k.removesuffix('_s')} {t[k]:.1f} s"
    for k in (
      "startup_s",
      "compile_s",
      "step_s",
      "data_s",
      "validation_s",
      "checkpoint_s",
      "logging_s",
      "profile_s",
      "other_s",
    )
  )
  return f"wall time {t['wall_s']:.1f} s: {parts}; goodput {t['goodput']:.1%}"


class Profiler:
  """A trace of the steps `start_step` .. `start_step + num_steps - 1` (numbered by the state's
  step before each), written to `<workdir>/profile` (per process on several hosts)."""

  def __init__(self, profile, workdir: str, clock: Clock):
    """`profile`: `config.profile` (start_step, num_steps, python)."""
    self.start, self.count, self.clock = profile.start_step, profile.num_steps, clock
    self.python = bool(profile.python)
    name = "profile" if jax.process_count() == 1 else f"profile/process_{jax.process_index()}"
    self.dir = fileio.join(workdir, name)
    self.active = False

  def before_step(self, step: int) -> None:
    if self.start is not None and step == self.start and not self.active:
      with self.clock.phase("profile"):
        fileio.makedirs(self.dir)
        # Perfetto's JSON beside XProf's xplane, where the folder is local
        options = jax.profiler.ProfileOptions()
        # Python function calls only when asked: a checkpoint save alone makes a million events
        options.python_tracer_level = int(self.python)
        jax.profiler.start_trace(
          self.dir, create_perfetto_trace=not fileio.is_remote(self.dir), profiler_options=options
        )
      self.active = True

  def after_step(self, step: int, state: Any) -> None:
    """`step`: steps done. Ends the trace after its last step (waits for the devices once)."""
    if self.active and step >= self.start + self.count:
      self.stop(state)

  def stop(self, state: Any = None) -> None:
    if self.active:
      if state is not None:
        with self.clock.phase("step"):  # the traced steps' device work
          jax.block_until_ready(state)
      with self.clock.phase("profile"):
        jax.profiler.stop_trace()
      self.active = False
      log.info(
        f"profile of steps {self.start}..{self.start + self.count - 1} written to "
        f"{self.dir} (tensorboard --logdir {self.dir}, profile tab; or ui.perfetto.dev)"
      )
