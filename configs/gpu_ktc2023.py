"""KTC2023's segmenter trained on one GPU for minutes (`make gpu-run`, stage 3): the measuring
system, phantoms, removals and objective of configs/ktc2023_model.py (the model that ships,
trained there for 2.7 hours on 2 CPU cores) at a size chosen for a 9-minute loan of one H200,
trained on fresh simulations made on the chip every step (`config.data.source="simulator"`, as
configs/v5e8_ktc2023.py) under a wall-clock budget (`config.time_budget_s`, which make gpu-run
sets to what is left of its 9 minutes): the learning rate's warm-up and cosine decay end as the
budget does (cdeit_jax/train/budget.py), `steps` is only a ceiling.

  python train.py --config configs/gpu_ktc2023.py --workdir runs/gpu_ktc2023 \\
      --config.time_budget_s=300
  python -m cdeit_jax.export --workdir runs/gpu_ktc2023 --out ktc2023_gpu.safetensors

The size (docs/gpu.md, "The size"): width 96, patch 8, two scales (a 16 x 16 token grid, 2.4 M
parameters, 1.7 GFLOP a training example against the shipped model's 1.1 M and 0.9). On the chip
each example's simulation (two dense Cholesky factorisations of 1,542 unknowns and their solves,
about 3.2 GFLOP in float32) costs more than this network's step, so the wider network costs the
run few examples; at equal FLOPs on 2 CPU cores (recipes/ktc_sizes.sh) it ties the shipped width
with 16 % fewer examples, where patch 4 (3.2 M, 8.5 GFLOP) lost with 58 % fewer. Its float32
weights (9.7 MB) come back within the 16 MiB a file may weigh. Global batch 64. Compiled for one
H100 without it (`--compile_topology h100-1`, docs/gpu.md): the step 0.63 GiB, the simulations'
batch 1.15 GiB, 26 cuDNN fused attention calls.

`configs/gpu_ktc2023.py:rehearsal` is the same recipe at a size a CPU runs in seconds (width 16,
patch 8, one scale, float32, batch 4, 32 statistics and 8 validation examples), which `make
gpu-run` trains on a CPU under a 2-minute budget: the same stages and files as on a GPU.
"""

import os

from cdeit_jax import config_lib
from cdeit_jax.common.errors import InputError

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg: str | None = None):
  c = config_lib.load(os.path.join(HERE, "ktc2023_model.py"))
  c.model.update(hidden_size=96, patch_size=8, num_scales=2, num_heads=4, dtype="bfloat16")
  c.data.update(source="simulator", units="simulated", path=None)
  # the validation simulations are the first 256 of the valid split: the same examples as
  # `python -m cdeit_jax.simulate --config configs/ktc2023_model.py --num_valid 256` writes
  c.simulator.update(stats_examples=2048, valid_examples=256)
  c.batch_size = 64
  c.steps = 1_000_000  # a ceiling: config.time_budget_s ends the run
  c.optimizer.update(lr=1e-3, schedule="warmup_cosine", warmup_steps=200, end_lr_factor=0.05)
  c.log_every = 50
  c.eval_every = 1000
  c.eval_batch_size = 64
  c.eval_max_batches = None  # all 256
  c.keep_checkpoints = 2
  if arg == "rehearsal":
    c.model.update(hidden_size=16, patch_size=8, num_scales=1, num_heads=2, dtype="float32")
    c.simulator.update(stats_examples=32, valid_examples=8)
    c.batch_size = 4
    c.eval_batch_size = 4
    c.optimizer.warmup_steps = 5
    c.log_every = 5
    c.eval_every = 100
  elif arg:
    raise InputError(
      f"configs/gpu_ktc2023.py:{arg}: the one variant is configs/gpu_ktc2023.py:rehearsal"
    )
  return c
