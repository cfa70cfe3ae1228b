"""The embedded default (`make demo`): a small physics-informed CDEIT trained on our own
simulations, CPU-sized.

  python -m cdeit_jax.simulate --out DATA --num_train 3000 --num_valid 64 --num_test 64
  python train.py --config configs/demo.py --workdir runs/demo --config.data.path=DATA

Patch 8, width 64, two scales (1.1 M parameters; a 16 x 16 token grid); beside the EIM, the
NOSER-weighted Tikhonov images of the voltages at two regularisation levels
(`cdeit_jax.eit.conditioning`); 5,000 steps of 16 (about 12 minutes on 2 CPU cores); the data
are the default `config.simulator` (a measuring system drawn per example). Sampling: 2 steps of
the published sampler (eta 1) and symmetric samples. How each choice was measured:
docs/history.md ("configs/demo.py").
"""

from cdeit_jax import config_lib


def get_config():
  c = config_lib.default_config()
  c.model.update(
    patch_size=8,
    hidden_size=64,
    num_heads=4,
    num_scales=2,
    cond="eim+linear",
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
  c.sampling.symmetric = True
  return c
