#!/usr/bin/env bash
# make ktc-demo: KTC2023's system (32 electrodes, 76 patterns, the levels' removed electrodes):
# simulate its training set once (cached), train the small CDEIT of configs/ktc2023.py on 2 CPU
# cores (each example loses one level's electrodes), answer the 28 public cases as the challenge
# asks and print the score per level beside the in-tool Tikhonov and all water (docs/ktc2023.md).
# Environment (make passes what it is given): BIN (default .venv/bin), KTC_DATA, KTC_RUN;
# defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
KTC_DATA=${KTC_DATA:-$HOME/.cache/cdeit-jax/ktc-sim-v2}
KTC_RUN=${KTC_RUN:-runs/ktc2023}
start=$(date +%s)
"$BIN/python" -m cdeit_jax.simulate --config configs/ktc2023.py --out "$KTC_DATA" \
  --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
"$BIN/python" train.py --config configs/ktc2023.py --workdir "$KTC_RUN" \
  --config.data.path="$KTC_DATA"
"$BIN/python" eval.py --workdir "$KTC_RUN" --data ktc2023_challenge \
  --data_path data/ktc2023/levels --out "$KTC_RUN/eval_ktc2023" --config.eval.tikhonov=True
echo "make ktc-demo: $(( $(date +%s) - start )) s (answers: $KTC_RUN/eval_ktc2023)"
