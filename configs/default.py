"""The CDEIT authors' published model and recipe (float32)."""

from cdeit_jax import config_lib


def get_config():
  return config_lib.default_config()
