"""TPU v5e-8, the published-size physics-informed model (`configs/v5e8_physics.py`) trained on
fresh simulations: every step's 64 examples (random phantoms, complete-electrode-model voltages
with 40 dB noise on both vectors, target image, EIM) are made on the 8 chips next to the step
from `config.simulator` (`cdeit_jax.data.simulator_source`); no dataset, no epochs. The statistics
come from the first 4,096 simulated examples and are stored in the checkpoint; validation uses
512 fixed simulated examples. Compiled ahead of time (`--compile_topology v5e-8`): the train
step 9.71 GiB of 15.75 GiB per chip (as configs/v5e8_physics.py), 55.1 TFLOP per step; the
simulated batch 0.09 GiB per chip and 45.2 GFLOP per step (dense Cholesky of 1,223 unknowns per
example), 0.082 % of the step's FLOPs. Same on GPUs: `--config configs/gpu.py
--config.data.source=simulator --config.model.cond=eim+linear`.

  python train.py --config configs/v5e8_simulator.py --workdir runs/v5e8_sim
  python train.py --config configs/v5e8_simulator.py --compile_topology v5e-8 --workdir /tmp/aot
"""

import os

from cdeit_jax import config_lib


def get_config():
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "v5e8_physics.py"))
  c.data.update(source="simulator", units="simulated")
  c.simulator.update(stats_examples=4096, valid_examples=512)
  return c
