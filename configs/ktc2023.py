"""KTC2023's measuring system (32 electrodes, 76 patterns, 2,356 values, electrodes removed as the
challenge's 7 levels remove them): a small CDEIT conditioned on the linear reconstructions of the
values each frame has (`config.model.cond="linear"`), trained on our simulations of the system,
CPU-sized (`make ktc-demo`).

  python -m cdeit_jax.simulate --config configs/ktc2023.py --out KTC_DATA --num_train 3000 \\
      --num_valid 64 --num_test 64
  python train.py --config configs/ktc2023.py --workdir runs/ktc2023 --config.data.path=KTC_DATA
  python eval.py --workdir runs/ktc2023 --data ktc2023_challenge \\
      --data_path data/ktc2023/levels --out OUT --config.eval.tikhonov=True

The phantoms: 1-3 objects of every kind, 0.1-0.3 of the radius, conductivity 10^(+-0.5..1.5)
times the water's (the challenge's plastic and metal objects); the contact impedance the
calibration's (`eit.calibration` on the public ref.mat: at its lower bound 1e-4, not
identifiable). Each training example loses one level's electrodes (drawn uniformly).
"""

import dataclasses
import os

from cdeit_jax import config_lib
from cdeit_jax.eit.layout import KTC_WIDTH_DEG
from cdeit_jax.eit.spec import SystemSpec


def get_config():
  # the demo's network and recipe (configs/demo.py); what differs is the system and its condition
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))
  c.simulator.update(
    layout="ktc2023",
    removals="ktc2023",
    contact_impedance=1e-4,
    system=dataclasses.asdict(SystemSpec.nominal(width_deg=KTC_WIDTH_DEG)),
  )
  c.simulator.phantom.update(
    min_inclusions=1, max_inclusions=3, min_size=0.1, max_size=0.3, v_min=0.5, v_max=1.5
  )
  c.model.cond = "linear"  # the Tikhonov images of the values each frame has (no EIM)
  c.sampling.symmetric = False  # the tank's symmetries act on CDEIT's EIM only
  c.sampling.num_samples = 8
  # the answer: per pixel, the class that at least half of the 8 samples put beyond +-0.2; a
  # class covering under 0.5 % of the tank is answered as water (python -m
  # cdeit_jax.answer_study, docs/ktc2023.md: at least as good as the mean at +-0.3 on the
  # demo's simulations, on challenge-like ones and on the public cases)
  c.eval.answer_rule = "vote:0.2:0.5:area=0.005"
  return c
