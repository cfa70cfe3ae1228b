"""A tiny model on the 22 UEF2017 cases shipped in data/ (the test suite; CPU, float32).

Runs with no data argument: `python train.py --config configs/test.py --workdir /tmp/run`.
"""

import os

from cdeit_jax import config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config():
  c = config_lib.default_config()
  c.model.update(patch_size=8, hidden_size=32, num_heads=4, num_scales=1)  # token grid 16
  c.data.update(
    path=os.path.join(REPO, "data"),
    train_split="uef2017",
    valid_split="uef2017",
    units="uef2017",
    stats="authors",
    num_threads=2,
    prefetch=2,
  )
  c.batch_size = 8
  c.steps = 20
  c.optimizer.lr = 1e-3
  c.log_every = 5
  c.eval_every = 10
  c.eval_max_batches = 1
  c.keep_checkpoints = 2
  return c
