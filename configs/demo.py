"""The embedded default (`make demo`): a small CDEIT trained on our own simulations, CPU-sized.

  python -m cdeit_jax.simulate --out DATA --num-train 3000 --num-valid 64 --num-test 64 --seed 0
  python train.py --config configs/demo.py --workdir runs/demo --config.data.path=DATA

Patch 8, width 64, two scales (1.1 M parameters; a 16 x 16 token grid): ~0.36 s per step of 16
on 2 CPU cores, 1,600 steps in ~10 minutes. Measured here: patch 4 at width 128 takes 6.7 s per
step (220 GFLOP) and patch 8 at width 128 0.7 s; neither fits a ~15-minute laptop demo. This
budget shows the whole pipeline; it is far from the authors' 200k steps, and the sampled
reconstructions of so short a run do not yet follow the measurements (see the README).
"""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.model.update(patch_size=8, hidden_size=64, num_heads=4, num_scales=2)
  c.data.update(num_threads=2, prefetch=4)
  c.batch_size = 16
  c.steps = 1600
  c.optimizer.update(lr=1e-3, schedule="warmup_cosine", warmup_steps=100, end_lr_factor=0.05)
  c.ema.update(update_every=1, update_after_step=50)
  c.log_every = 50
  c.eval_every = 800
  c.eval_max_batches = 4
  c.keep_checkpoints = 2
  return c
