"""The embedded default (`make demo`): a small CDEIT trained on our own simulations, CPU-sized.

  python -m cdeit_jax.simulate --out DATA --num-train 3000 --num-valid 64 --num-test 64 --seed 0
  python train.py --config configs/demo.py --workdir runs/demo --config.data.path=DATA

Patch 8, width 128, two scales (4.2 M parameters; a 16 x 16 token grid): 0.71 s per step of 16
on 2 CPU cores (42 GFLOP). Patch 4 at width 128 was measured at 6.7 s per step (220 GFLOP): too
slow for a ~15-minute demo on a laptop. On an accelerator use configs/default.py's model.
"""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.model.update(patch_size=8, hidden_size=128, num_heads=4, num_scales=2)
  c.data.update(num_threads=2, prefetch=4)
  c.batch_size = 16
  c.steps = 800
  c.optimizer.update(lr=5e-4, schedule="warmup_cosine", warmup_steps=100, end_lr_factor=0.05)
  c.ema.update(update_every=1, update_after_step=50)
  c.log_every = 50
  c.eval_every = 400
  c.eval_max_batches = 4
  c.keep_checkpoints = 2
  return c
