"""TPU v5e-8 (8 cores, one host): global batch 64, bfloat16 compute."""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.batch_size = 64
  c.model.dtype = "bfloat16"
  return c
