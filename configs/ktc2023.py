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

from cdeit_jax import config_lib
from cdeit_jax.eit.spec import SystemSpec


def get_config():
  c = config_lib.default_config()
  c.simulator.update(
    layout="ktc2023",
    removals="ktc2023",
    contact_impedance=1e-4,
    system=dataclasses.asdict(SystemSpec.nominal()),
  )
  c.simulator.phantom.update(
    min_inclusions=1, max_inclusions=3, min_size=0.1, max_size=0.3, v_min=0.5, v_max=1.5
  )
  c.model.update(
    patch_size=8,
    hidden_size=64,
    num_heads=4,
    num_scales=2,
    cond="linear",
    cond_alphas=(0.03, 0.3),
  )
  c.data.update(num_threads=2, prefetch=4)
  c.batch_size = 16
  c.steps = 5000
  c.optimizer.update(lr=1e-3, schedule="warmup_cosine", warmup_steps=100, end_lr_factor=0.05)
  c.ema.update(update_every=1, update_after_step=50)
  c.log_every = 50
  c.eval_every = 1000
  c.eval_max_batches = 4
  c.keep_checkpoints = 2
  c.sampling.steps = 2
  c.sampling.num_samples = 8  # the answer thresholds the mean of 8 samples
  return c
