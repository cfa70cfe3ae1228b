"""The model that ships for CDEIT's 16-electrode system (`models/cdeit16`, `make cdeit16-model`):
the demo's network and data distribution (configs/demo.py: 1.1 M parameters, the EIM and two
Tikhonov images as the condition, a measuring system drawn per simulated example), trained six
times longer on eight times the simulations.

  python -m cdeit_jax.simulate --out DATA --num_train 24000 --num_valid 256 --num_test 64 \\
      --tr_splits valid,test
  python train.py --config configs/cdeit16.py --workdir runs/cdeit16 --config.data.path=DATA

30,000 steps of 16 (20 passes over the 24,000 examples), the learning rate's cosine decay over
all of them; validated every 2,000 steps on 256 examples.
"""

import os

from cdeit_jax import config_lib


def get_config():
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))
  c.steps = 30_000
  c.eval_every = 2000
  c.eval_max_batches = 16  # the 256 validation examples
  c.log_every = 200
  c.keep_checkpoints = 3
  c.sampling.num_samples = 8
  return c
