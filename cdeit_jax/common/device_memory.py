"""Compiled programs and device memory, in one place for the trainer, evaluation and the
ahead-of-time check: what a compiled program needs (the compiler's memory analysis), what a
device offers, and whether an error means "out of memory" (`compat` reads XLA's text). What to
change when a train step does not fit is training's (`cdeit_jax.train.memory_fit`)."""

from __future__ import annotations

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
