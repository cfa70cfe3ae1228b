"""Stopping a run at a step every process agrees on, after a SIGTERM (a preemption) or a first
Ctrl-C, so that the step is saved and a rerun resumes from it (`train.resume`).
"""

from __future__ import annotations

import signal

import jax
from jax.experimental import multihost_utils


class Preemption:
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
