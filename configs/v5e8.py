"""TPU v5e-8 (8 chips, one host): global batch 64, bfloat16 compute, splash attention ("auto").

Compiled ahead of time (`train.py --compile_topology v5e-8`): 9.68 GiB of 15.75 GiB per chip
(61 %). 16 per chip (global batch 128) compiles at 14.88 GiB (94 %), too close to the limit.
"""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.batch_size = 64
  c.expected_devices = 8  # a run on fewer says so (on a CPU: docs/training.md)
  c.model.dtype = "bfloat16"
  return c
