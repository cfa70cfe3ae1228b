"""TPU v5e-8, KTC2023's system at the published model's size: configs/ktc2023_model.py's
measuring system (drawn per example around the calibrated device), challenge-like phantoms and
removals with configs/v5e8.py's model and recipe (global batch 64,
bfloat16, splash attention), conditioned on the linear reconstructions of the values each frame
has (`cond="linear"`, 64 x 64 grid), trained on fresh simulations made on the chips every step
(`config.data.source="simulator"`, no files). Compile-only check without a TPU:

  python train.py --config configs/v5e8_ktc2023.py --compile_topology v5e-8 --workdir /tmp/aot
  python train.py --config configs/v5e8_ktc2023.py --workdir gs://BUCKET/runs/ktc2023
"""

import os

from cdeit_jax import config_lib

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
  c = config_lib.load(os.path.join(HERE, "v5e8.py"))
  ktc = config_lib.load(os.path.join(HERE, "ktc2023_model.py"))
  c.simulator = ktc.simulator
  c.simulator.update(stats_examples=4096, valid_examples=512)
  c.model.update(cond="linear", cond_alphas=(0.03, 0.3), cond_grid=64)
  c.data.update(source="simulator", units="simulated", path=None)
  return c
