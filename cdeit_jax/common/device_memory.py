"""Compiled programs and device memory, in one place for the trainer, evaluation and the
ahead-of-time check: what a compiled program needs (the compiler's memory analysis) and which
fused attention kernels it holds, what a device offers, and whether an error means "out of
memory" (`compat` reads XLA's text). What to change when a train step does not fit is
training's (`cdeit_jax.train.memory_fit`)."""

from __future__ import annotations

import re

import jax

GIB = 2**30


def memory_of(compiled) -> dict[str, int]:
  """The compiler's memory analysis per device (empty where the backend reports none), with
  `peak_bytes` = arguments + outputs - aliased + temporaries + generated code."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend reports it
    return {}
  if m is None:
    return {}
  out = {
    k: int(getattr(m, k))
    for k in (
      "argument_size_in_bytes",
      "output_size_in_bytes",
      "temp_size_in_bytes",
      "alias_size_in_bytes",
      "generated_code_size_in_bytes",
    )
    if hasattr(m, k)
  }
  out["peak_bytes"] = (
    out.get("argument_size_in_bytes", 0)
    + out.get("output_size_in_bytes", 0)
    - out.get("alias_size_in_bytes", 0)
    + out.get("temp_size_in_bytes", 0)
    + out.get("generated_code_size_in_bytes", 0)
  )
  return out


_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
SPLASH = "tpu_custom_call (splash)"


def fused_attention(compiled) -> dict:
  """The fused attention kernels a compiled program holds, counted in its optimized HLO: cuDNN's
  (`__cudnn$fmha...` custom calls, forward and backward) and the splash kernel (a TPU custom call
  named for it). {"calls": total, "targets": {target: count}}; calls 0 where XLA's own attention
  or the blocked loop was compiled instead, or where the backend gives no HLO text."""
  try:
    text = compiled.as_text()
  except Exception:  # not every backend prints its program
    text = ""
  targets: dict[str, int] = {}
  for line in (text or "").splitlines():
    m = _CUSTOM_CALL.search(line)
    if m is None:
      continue
    if m.group(1).startswith("__cudnn$fmha"):
      targets[m.group(1)] = targets.get(m.group(1), 0) + 1
    elif m.group(1) == "tpu_custom_call" and "splash" in line:
      targets[SPLASH] = targets.get(SPLASH, 0) + 1
  return {"calls": sum(targets.values()), "targets": targets}


def budget(device: jax.Device) -> tuple[int | None, int]:
  """(bytes one device's program may use, how many local devices share that memory).

  Accelerators: the device's own memory limit. CPU: the host's available memory, shared by every
  local (fake) device. None where neither is known."""
  stats = {}
  try:
    stats = device.memory_stats() or {}
  except Exception:  # backends without memory statistics
    pass
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0)), 1
  try:
    with open("/proc/meminfo") as fh:
      info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
    return info["MemAvailable"], jax.local_device_count()
  except (OSError, KeyError, ValueError):
    return None, 1
