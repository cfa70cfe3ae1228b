"""A test set for KTC2023 models from a measuring system shifted beyond the calibration (the
answer rule study's robustness check, docs/ktc2023.md): configs/ktc2023_model.py's phantoms,
measured by systems whose gain is off by up to 20 %, whose contact impedances spread over three
decades (1e-5 to 1e-2), whose electrodes are turned by up to a degree and each moved by up to a
degree, 4.5-7 degrees wide (KTC's 5.625) and 10 % apart, in a tank within 5 % of the radius
and 20 % of the background conductivity, at 35 +- 10 dB.

  python -m cdeit_jax.simulate --config configs/ktc2023_shifted.py --out SHIFTED \\
      --num_test 256 --tr_splits test
  python -m cdeit_jax.answer_study --workdir MODEL --sims SHIFTED/test
"""

import dataclasses
import os

from cdeit_jax import config_lib
from cdeit_jax.eit.spec import SystemSpec


def get_config():
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ktc2023_model.py"))
  shifted = SystemSpec(
    gain=(0.8, 1.2),
    contact_impedance=(1e-5, 1e-2),
    rotation_deg=1.0,
    jitter_deg=1.0,
    width_deg=(4.5, 7.0),
    width_jitter=0.1,
    passive=0.0,
    radius=(0.95, 1.05),
    background=(0.8, 1.2),
    snr_spread_db=10.0,
  )
  c.simulator.system = dataclasses.asdict(shifted)
  c.simulator.snr_db = 35.0
  c.simulator.seed = 7  # other phantoms than the training set's
  return c
