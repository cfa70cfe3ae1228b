"""TPU v5e-8, the published-size model with the physics-informed condition: beside the EIM, one
NOSER-weighted Tikhonov reconstruction of the voltages per level in `model.cond_alphas`
(`cdeit_jax.eit.conditioning`). Everything else as `configs/v5e8.py` (global batch 64, bfloat16,
splash attention). Compiled ahead of time (`--compile_topology v5e-8`): 9.71 GiB of 15.75 GiB
per chip (62 %; configs/v5e8.py: 9.68 GiB), sampler 2.02 GiB at batch 64.
For GPUs: `--config configs/gpu.py --config.model.cond=eim+linear`.

  python train.py --config configs/v5e8_physics.py --workdir runs/v5e8_physics \\
      --config.data.path=DATA
  python train.py --config configs/v5e8_physics.py --compile_topology v5e-8 --workdir /tmp/aot
"""

import os

from cdeit_jax import config_lib


def get_config():
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "v5e8.py"))
  c.model.update(cond="eim+linear", cond_alphas=(0.03, 0.3))
  return c
