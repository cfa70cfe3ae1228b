"""Train-step throughput of CDEIT on all local devices, after compilation; prints JSON.

  python bench/bench_train.py                                   # published size, float32
  python bench/bench_train.py --config configs/v5e8.py --per-device-batch 8
Reports samples/s, achieved TFLOP/s per device (model FLOPs counted analytically with every loop
iteration, `cdeit_jax.model.flops`) and the fraction of the device's bf16 peak where known; on a
CPU, the fraction of the machine's own float32 matmul rate timed in the same run
(`cdeit_jax.train.step_rate.measure`).
"""

from __future__ import annotations

import argparse
import json

from cdeit_jax.common import cpu_tuning

if __name__ == "__main__":
  cpu_tuning.apply()  # as train.py and eval.py run (may re-execute this command once)

from cdeit_jax import config_lib  # noqa: E402
from cdeit_jax.model import attention  # noqa: E402
from cdeit_jax.train.step_rate import measure  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=None, help="config file (default: the published recipe)")
  p.add_argument("--per-device-batch", type=int, default=2)
  p.add_argument("--accum-steps", type=int, default=1)
  p.add_argument("--dtype", default=None, choices=sorted(config_lib.DTYPES))
  p.add_argument("--hidden-size", type=int, default=None)
  p.add_argument("--remat", action="store_true")
  p.add_argument("--attention-impl", default=None, choices=attention.IMPLS)
  p.add_argument("--attention-query-chunk", type=int, default=None)
  p.add_argument("--steps", type=int, default=3, help="timed steps")
  p.add_argument(
    "--sync-each-step",
    action="store_true",
    help="wait for each step and also report the fastest (step_s_min)",
  )
  a = p.parse_args()

  cfg = config_lib.load(a.config) if a.config else config_lib.default_config()
  if a.dtype:
    cfg.model.dtype = a.dtype
  if a.hidden_size:
    cfg.model.hidden_size = a.hidden_size
  if a.remat:
    cfg.model.remat = True
  if a.attention_impl:
    cfg.model.attention_impl = a.attention_impl
  if a.attention_query_chunk:
    cfg.model.attention_query_chunk = a.attention_query_chunk
  print(json.dumps(measure(cfg, a.per_device_batch, a.accum_steps, a.steps, a.sync_each_step)))


if __name__ == "__main__":
  main()
