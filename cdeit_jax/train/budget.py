"""A wall-clock budget for one invocation of train.py (`config.time_budget_s`).

A lent accelerator for minutes, a reservation of some hours on a pod: the run has a time, not a
number of steps. The budget counts from train.py's start (imports, start-up and compilation
included). At the end of every log window (the loop's one host sync) it decides two things from
what was measured, not from guesses:

- whether to stop now: the time left must cover the final validation and checkpoint (the last
  ones measured; with a budget the first window validates and saves before it decides, so one
  is measured before the first decision), a margin and, with several processes, the next window;
  a stop validates and saves, like the last step of a run (one process also checks after every
  step, at no cost, so a slow window cannot overrun: `expired`);
- the schedule's horizon (`training.ScheduleState.horizon`), the step the learning rate's decay
  ends at: the step reached plus the steps the measured rate (since the first window, whose
  steps include compiling the data's function) fits into the time left, at most
  `config.steps`. So a warm-up-and-cosine run decays to its end value as the time runs out, on
  any chip, instead of stopping at a high learning rate or decaying early.

The horizon is part of the optimizer state and is checkpointed; a resumed run gets a budget of
its own (this invocation's) and re-estimates it. With several processes, process 0's clock
decides for all (one broadcast a window). Without a budget nothing here runs.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils


def margin(seconds: float) -> float:
  """Time kept free at the end: 1 % of the budget, at least 2 s (a late log line, a slow write)."""
  return max(2.0, 0.01 * seconds)


@dataclasses.dataclass
class Decision:
  """One window's verdict: stop now (`stop`), and the horizon for the steps after it."""

  stop: bool
  horizon: int
  seconds_left: float


class Budget:
  """`seconds` of wall clock from `start` (a `time.perf_counter()` value: train.py's start) for
  a run that may take at most `steps` steps."""

  def __init__(self, seconds: float, start: float, steps: int):
    self.seconds, self.deadline, self.steps = float(seconds), start + float(seconds), int(steps)
    self.end_s: float | None = None  # the last validation + checkpoint measured
    self.horizon: int | None = None  # the horizon set last (the loop sets it)
    self._loop: tuple[int, float] | None = None  # (step, time) the measured rate starts at
    self._warm = False  # whether the first window (compilations) is behind

  def begin(self, step: int, now: float) -> None:
    """The steps begin (after compilation and the restore) at `step`."""
    self._loop = (step, now)

  @property
  def measured_end(self) -> bool:
    """Whether a validation and checkpoint were timed (the first window's are, with a budget)."""
    return self.end_s is not None

  def ended_window(self, seconds: float) -> None:
    """The validation and checkpoint of a window took `seconds` (the final ones will take about
    the same: the last measured is kept, not the first, which included the compilation)."""
    self.end_s = float(seconds)

  def expired(self, now: float) -> bool:
    """Between windows, on one process: whether only the final validation and checkpoint (as
    last measured) and the margin are left, so the run stops at this step instead of at the
    window's end (a slow first window after a long start-up). With several processes False: they
    stop together at a window's end (`decide`)."""
    if jax.process_count() > 1:
      return False
    return now >= self.deadline - (self.end_s or 0.0) - margin(self.seconds)

  def decide(self, step: int, now: float, window_s: float) -> Decision:
    """At the end of the window that ended at `step` and lasted `window_s`: stop, and the
    horizon (module docstring)."""
    first, began = self._loop if self._loop is not None else (step, now)
    rate = (step - first) / (now - began) if now > began and step > first else 0.0
    if not self._warm:  # the rate from here on: the first window compiled the data's function
      self._loop, self._warm = (step, now), True
    # one process stops at any step (`expired`); several only at a window's end, so the next
    # window must fit too
    window = window_s if jax.process_count() > 1 else 0.0
    left = self.deadline - now - window - (self.end_s or 0.0) - margin(self.seconds)
    horizon = min(self.steps, step + max(int(rate * left), 0))
    decision = Decision(left <= 0, max(horizon, step), self.deadline - now)
    return agreed(decision)


def agreed(decision: Decision) -> Decision:
  """Process 0's decision on every process (the same step stops everywhere); as is with one."""
  if jax.process_count() == 1:
    return decision
  got = multihost_utils.broadcast_one_to_all(
    np.asarray([decision.stop, decision.horizon, decision.seconds_left], np.float64)
  )
  return Decision(bool(got[0]), int(got[1]), float(got[2]))
