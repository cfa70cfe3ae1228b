"""A tiny model for the test suite (CPU, float32)."""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.model.hidden_size = 64
  return c
