#!/usr/bin/env bash
# The scaling check behind configs/gpu_ktc2023.py's size (docs/gpu.md, "The size"): three sizes
# of KTC2023's segmenter at equal FLOPs on the chip, where each training example costs its
# simulation (about 3.2 GFLOP: two Cholesky factorisations of 1,542 unknowns and their solves,
# float32) plus the network's training FLOPs (cdeit_jax.model.flops), trained on 2 CPU cores from
# the simulations `make ktc-model` makes, each with warm-up and cosine decay over its own steps,
# and scored with stage one's answer rule on the 256 validation simulations (every level) and
# the held-out families (make ktc-heldout's, levels 1-4 and 5-7).
#   recipes/ktc_sizes.sh [STEPS_A]      # STEPS_A: the smallest size's steps (default 1500)
#   SIZES="A:64:8:2:4 B:96:8:2:4" OUT=runs/ktc_sizes2 recipes/ktc_sizes.sh 3000   # twice the FLOPs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${KTC_MODEL_DATA:-$HOME/.cache/cdeit-jax/ktc-model-sim-v1}
HELD=${KTC_HELD:-$HOME/.cache/cdeit-jax/ktc-heldout-v1}
OUT=${OUT:-runs/ktc_sizes}
RULE=${RULE:-argmax:water=0.9:area=0.005}
STEPS_A=${1:-1500}
SIM_GFLOP=3.2
# name:hidden:patch:scales:heads
SIZES=${SIZES:-"A:64:8:2:4 B:96:8:2:4 D:96:4:3:4"}
gflop() {  # training GFLOP of one example of a size (cdeit_jax.model.flops)
  $PY -c "
from cdeit_jax import config_lib
from cdeit_jax.checkpoints import loading
from cdeit_jax.model import flops
c = config_lib.load('configs/ktc2023_model.py')
c.model.update(hidden_size=$1, patch_size=$2, num_scales=$3, num_heads=$4)
print(flops.train_flops_per_example(config_lib.model_kwargs(c, loading.resolve(c), 'cpu')) / 1e9)" 2>/dev/null
}
base=$(gflop 64 8 2 4)
for size in $SIZES; do
  IFS=: read -r name h p s nh <<<"$size"
  g=$(gflop "$h" "$p" "$s" "$nh")
  steps=$($PY -c "print(round($STEPS_A * ($SIM_GFLOP + $base) / ($SIM_GFLOP + $g)))")
  run=$OUT/$name
  echo "size $name: width $h, patch $p, scales $s: $g GFLOP an example, $steps steps of 16"
  start=$(date +%s)
  $PY train.py --config configs/ktc2023_model.py --workdir "$run" --config.data.path="$DATA" \
    --config.model.hidden_size="$h" --config.model.patch_size="$p" \
    --config.model.num_scales="$s" --config.model.num_heads="$nh" --config.steps="$steps" \
    --config.eval_every="$steps" --config.log_every=100 --config.optimizer.warmup_steps=100
  echo "size $name: trained in $(( $(date +%s) - start )) s"
  $PY -m cdeit_jax.answer_study --workdir "$run" --sims "$DATA/valid" --rules "$RULE" \
    --out "$run/valid.json"
  for group in few many; do
    $PY -m cdeit_jax.answer_study --workdir "$run" --sims "$HELD/$group" --num 100 \
      --rules "$RULE" --out "$run/heldout_$group.json"
  done
done
