"""Whether the train step fits the devices' memory, and what to change when it does not (the
advice names config keys, most effective first)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import ml_collections

from cdeit_jax import config_lib
from cdeit_jax.common.device_memory import GIB
from cdeit_jax.common.errors import DoesNotFit


def fit_advice(cfg: ml_collections.ConfigDict, num_devices: int, platform: str) -> str:
  """What to change when the train step does not fit, most effective first."""
  per_device = cfg.batch_size // max(num_devices * cfg.accum_steps, 1)
  tips = []
  impl = config_lib.model_kwargs(cfg, None, platform)["attention_impl"]
  if impl == "xla":
    tips.append(
      "config.model.attention_impl=auto (a memory-efficient attention kernel for "
      "this platform instead of the full 4096 x 4096 score matrix)"
    )
  if per_device > 1:
    tips.append(
      f"config.accum_steps={2 * cfg.accum_steps} (same global batch "
      f"{cfg.batch_size}, {per_device // 2} per device per micro-batch) or a smaller "
      f"config.batch_size (a multiple of {num_devices})"
    )
  if not cfg.model.remat:
    tips.append("config.model.remat=True (recompute each block in the backward pass)")
  if not cfg.shard_params:
    tips.append("config.shard_params=True (split parameters and optimizer state over devices)")
  if cfg.model.dtype == "float32":
    tips.append("config.model.dtype=bfloat16")
  return "; or ".join(tips) if tips else "a topology with more memory per device"


def largest_fitting(
  measure: Callable[[int], tuple[bool, int | None]],
  start: int,
  budget: int,
  most: int = 4096,
  known: dict[int, tuple[bool, int | None]] | None = None,
) -> tuple[int, dict[int, tuple[bool, int | None]]]:
  """The largest batch b <= `most` with measure(b) fitting, measure(b + 1) not (0: none fits), and
  every batch measured: {b: (fits, peak bytes)}. `measure` compiles, so few are asked: `start`
  and twice it give the bytes an example adds (memory is near linear in the batch), the batch
  that reaches `budget` is measured, then its neighbour, and what is left between a batch that
  fits and one that does not is halved (steps doubling up where none is known not to fit): the
  measurements decide, not the prediction. `known`: batches measured before."""
  tried: dict[int, tuple[bool, int | None]] = dict(known or {})

  def fits(b: int) -> bool:
    if b < 1:
      return True  # the floor: no batch at all
    if b not in tried:
      tried[b] = measure(b)
    return tried[b][0]

  if fits(start) and start < most and fits(min(2 * start, most)):
    (_, p0), (_, p1) = tried[start], tried[min(2 * start, most)]
    per_example = (p1 - p0) / start if p0 and p1 and p1 > p0 else None
    guess = start + int((budget - p0) // per_example) if per_example else 4 * start
    fits(min(max(guess, 2 * start), most))
  lo = max((b for b, (ok, _) in tried.items() if ok), default=0)
  above = [b for b, (ok, _) in tried.items() if not ok and b > lo]
  if above:  # the prediction is most often one off: its neighbour first, then halving
    hi = min(above)
    if hi - 1 > lo and fits(hi - 1):
      lo = hi - 1
  else:  # no batch known not to fit: steps doubling up from the largest that fits
    step = 1
    while lo + step <= most and fits(lo + step):
      lo, step = lo + step, 2 * step
    hi = min(lo + step, most + 1)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
  return lo, tried


def train_step_report(memory: dict[str, int], cfg: ml_collections.ConfigDict) -> str:
  """One line on the train step's memory per device; DoesNotFit (with advice) when it exceeds
  the device's limit."""
  if not memory:
    return "memory analysis: not reported by this backend"
  gib = lambda b: b / GIB
  need = memory["peak_bytes"]
  text = (
    f"memory per device: arguments {gib(memory.get('argument_size_in_bytes', 0)):.2f} GiB, "
    f"outputs {gib(memory.get('output_size_in_bytes', 0)):.2f} GiB (aliased "
    f"{gib(memory.get('alias_size_in_bytes', 0)):.2f}), temporaries "
    f"{gib(memory.get('temp_size_in_bytes', 0)):.2f} GiB; total ~{gib(need):.2f} GiB"
  )
  limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
  if limit:
    text += f" of {gib(limit):.2f} GiB"
    if need > limit:
      raise DoesNotFit(
        f"{text}\nThe train step will not fit: set "
        f"{fit_advice(cfg, jax.device_count(), jax.default_backend())}."
      )
  return text


def does_not_fit(e: BaseException, cfg: ml_collections.ConfigDict) -> DoesNotFit:
  """The one-line error for a train step the devices' memory refused (`e`), with advice."""
  return DoesNotFit(
    f"the train step does not fit the devices' memory ({str(e).splitlines()[0][:200]}). "
    f"Set {fit_advice(cfg, jax.device_count(), jax.default_backend())}. Check a "
    "config without the hardware: train.py --compile_topology v5e-8 (TPU) or h100-8 (GPU)."
  )
