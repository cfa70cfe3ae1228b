"""Stage two of the model that ships for KTC2023's device (`make ktc-model`): the segmenter of
configs/ktc2023_model.py fine-tuned from its 24,000-step EMA weights on the same simulations
with the target frame drifting against the empty tank's (`SystemSpec.drift`, 0.9-1.1
log-uniform per example); `make ktc-model` then takes the point KTC_MODEL_ALPHA along the line
from its start (WiSE-FT, `python -m cdeit_jax.interpolate`; 1, these weights, is what the
validation simulations chose).

  python -m cdeit_jax.simulate --config configs/ktc2023_model_drift.py --out DATA_DRIFT \\
      --num_train 24000 --num_valid 256 --num_test 256 --tr_splits valid,test
  python train.py --config configs/ktc2023_model_drift.py --workdir runs/ktc2023_model_drift \\
      --config.data.path=DATA_DRIFT --config.init_from=runs/ktc2023_model
  python -m cdeit_jax.interpolate --workdir runs/ktc2023_model_drift --alpha 1 \\
      --out runs/ktc2023_model_wise

Why: the public frames drift (`python -m cdeit_jax.frame_drift`: target 3's frame is 2.2 %
below the empty tank's, target 4's 7.8 %), which no stage-one example did. The simulations are
stage one's (the same seed: phantoms, systems and noise), each target frame times its drift. The
fine-tuning keeps its start's voltage statistics and condition calibration (the same measuring
system: `loading.start_inputs`), so the two interpolate. On the 24,000-step start, the fine-tuned
weights score 0.788 a target on the undrifted validation simulations (the start 0.794) and 0.783
on the drifted ones (the start 0.673); half-way, 0.793 and 0.752 (docs/ktc2023.md).
"""

import os

from cdeit_jax import config_lib


def get_config():
  here = os.path.dirname(os.path.abspath(__file__))
  c = config_lib.load(os.path.join(here, "ktc2023_model.py"))
  c.simulator.system.drift = (0.9, 1.1)
  c.steps = 3000
  c.optimizer.update(lr=3e-4, schedule="warmup_cosine", warmup_steps=100, end_lr_factor=0.05)
  c.eval_every = 1000
  return c
