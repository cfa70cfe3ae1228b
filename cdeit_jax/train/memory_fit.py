"""Whether the train step fits the devices' memory, and what to change when it does not (the
advice names config keys, most effective first)."""

from __future__ import annotations

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
    "config without the hardware: train.py --compile_topology v5e-8 (TPU)."
  )
