"""NVIDIA GPUs (one or more, one or more hosts): bfloat16 compute; attention "auto" picks cuDNN's
fused kernel (16-bit compute), so no 4,096 x 4,096 score matrix is stored. Compiled for GPUs
without one (`train.py --config configs/gpu.py --compile_topology h100-8`, docs/gpu.md): the
step needs 20.96 GiB of an H100's 59.33 (one GPU; 4.96 a GPU on eight) and 21.05 of an H200's
105.75, with 42 cuDNN fused attention calls; the largest batch a GPU that fits is 96 on an H100
(79 on eight) and 173 on an H200.

`configs/gpu.py:rehearsal` is the same recipe at a size a CPU times in seconds (patch 8, width
64, float32, batch 2; still the published code's shape: 4 scales, 16 heads a block), which
`make gpu-run` measures on a CPU where it measures the published size on a GPU.
"""

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError


def get_config(arg: str | None = None):
  c = config_lib.default_config()
  c.batch_size = 32
  c.model.dtype = "bfloat16"
  if arg == "rehearsal":
    c.model.update(patch_size=8, hidden_size=64, dtype="float32")
    c.batch_size = 2
  elif arg:
    raise InputError(f"configs/gpu.py:{arg}: the one variant is configs/gpu.py:rehearsal")
  return c
