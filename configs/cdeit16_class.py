"""Stage two of the model that ships for CDEIT's 16-electrode system (`make cdeit16-model`):
configs/cdeit16.py's network fine-tuned to draw class maps, each object at +-1 (the convention of
UEF2017's ground truths), from its 30,000-step EMA weights.

  python -m cdeit_jax.simulate --out DATA --num_train 24000 --num_valid 256 --num_test 64 \\
      --tr_splits valid,test --config.simulator.phantom.target=class
  python train.py --config configs/cdeit16_class.py --workdir runs/cdeit16_class \\
      --config.data.path=DATA --config.init_from=runs/cdeit16

The simulations are configs/cdeit16.py's, voltages bit for bit (the same seed and phantoms);
only the target changes: a label image shows each object's log10 contrast, 0.5-1 in magnitude,
and a network trained on them draws real tanks' objects, whose truths are +-1, at about 0.65
(models/cdeit16's mean inside UEF2017's objects). Why and how much: docs/checkpoints.md.
"""

import os

from cdeit_jax import config_lib


def get_config():
  c = config_lib.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cdeit16.py"))
  c.simulator.phantom.target = "class"
  c.steps = 4000
  c.optimizer.update(lr=3e-4, schedule="warmup_cosine", warmup_steps=100, end_lr_factor=0.05)
  c.eval_every = 1000
  return c
