"""NVIDIA GPUs (one or more, one or more hosts): bfloat16 compute, fused cuDNN attention."""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.batch_size = 32
  c.model.dtype = "bfloat16"
  c.model.attention_impl = "cudnn"
  return c
