"""The log window: the device metrics of the steps since the last log, fetched once at the
window's end (one host sync), with their rates, the gradient norms outside a plausible range,
and the stop at a non-finite loss; the console's progress line of a window, with the time left.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from cdeit_jax.common import hardware, logs
from cdeit_jax.common.errors import CdeitError

log = logs.log.getChild("train")


class NonFiniteLoss(CdeitError, RuntimeError):
  pass


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
      kept = (
        f"The last good checkpoint is step {last_good} in {workdir}/checkpoints"
        if last_good is not None
        else f"No checkpoint was saved before it ({workdir}/checkpoints holds none of this run)"
      )
      raise NonFiniteLoss(
        f"the loss or gradient became non-finite at step {bad}; stopping without saving. "
        f"{kept} (lower config.optimizer.lr, check config.optimizer.grad_clip and the data)."
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


def eta_s(step: int, last: int, start: int, elapsed_s: float) -> float | None:
  """Seconds to step `last` at this run's rate so far: `elapsed_s` since its steps began at step
  `start` (validations and checkpoints included, as the steps to come will have them); None
  before a step is done."""
  if step <= start:
    return None
  return (last - step) * elapsed_s / (step - start)


def duration(seconds: float) -> str:
  """`3h05m`, `4m10s`, `12s`: a time left, as a progress line shows it."""
  s = round(seconds)
  if s >= 3600:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  if s >= 60:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s}s"


def progress_line(step: int, last: int, window_start: int, m: dict[str, Any]) -> str:
  """The console's line of the log window that ends at `step` (steps `window_start` + 1 ..
  `step`): the figures of its `metrics.jsonl` record `m`, the same numbers."""
  steps = f"step {step}" if step == window_start + 1 else f"steps {window_start + 1}-{step}"
  parts = [
    f"step {step}/{last}: loss {m['loss']:.4g} (mean of {steps})",
    f"grad norm {m['grad_norm']:.3g}",
    f"lr {m['lr']:.3g}",
    f"{m['samples_per_sec']:.4g} samples/s",
  ]
  tflops = f"{m['tflops_per_device']:.3g} TFLOP/s per device"
  if m.get("fraction_of_peak") is not None:
    tflops += f" ({m['fraction_of_peak']:.1%} of peak)"
  parts.append(tflops)
  if m.get("val_loss") is not None:
    parts.append(f"val_loss {m['val_loss']:.4g}")
  if m.get("eta_s") is not None and step < last:
    parts.append(f"ETA {duration(m['eta_s'])}")
  return ", ".join(parts)
