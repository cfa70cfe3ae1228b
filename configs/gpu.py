"""NVIDIA GPUs (one or more, one or more hosts): bfloat16 compute; attention "auto" picks cuDNN's
fused kernel (16-bit compute), so no 4,096 x 4,096 score matrix is stored."""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.batch_size = 32
  c.model.dtype = "bfloat16"
  return c
