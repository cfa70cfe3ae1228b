#!/usr/bin/env bash
# make ktc-model: the model that ships for KTC2023's device (models/ktc2023;
# configs/ktc2023_model.py, then configs/ktc2023_model_drift.py): simulate 24,000 training
# examples with challenge-like phantoms and the measuring system drawn around the calibrated
# device, and the same with the target frame drifting against the empty tank's (both cached; a
# cached folder with fewer is extended); train the segmenter (about 110 min on 2 cores), fine-tune
# it on the drifting frames (about 15 min; rerunning either resumes) and take the point
# KTC_MODEL_ALPHA along the line between the two (WiSE-FT; 1, the fine-tuned weights, is what the
# validation simulations chose: docs/ktc2023.md); choose the answer rule on the validation
# simulations at every level (python -m cdeit_jax.answer_study; the public 28 beside), score
# it on both test splits and the held-out families (recipes/ktc_heldout.sh), answer the public
# cases with it and the refinement against each frame (KTC_MODEL_REFINEMENT; "" for none:
# docs/ktc2023.md, "Refinement against the frame"), and write the model folder with the rule,
# the refinement and the scores.
# Environment (make passes what it is given): BIN (default .venv/bin), KTC_MODEL_DATA,
# KTC_MODEL_DRIFT_DATA, KTC_MODEL_BASE, KTC_MODEL_FINE, KTC_MODEL_ALPHA, KTC_MODEL_RUN,
# KTC_MODEL_SIM (the simulations' sizes), KTC_MODEL_REFINEMENT, KTC_HELD (the held-out
# families); defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/ktc_heldout.sh  # ktc_heldout MODEL OUT RULES
BIN=${BIN:-.venv/bin}
KTC_MODEL_DATA=${KTC_MODEL_DATA:-$HOME/.cache/cdeit-jax/ktc-model-sim-v1}
KTC_MODEL_DRIFT_DATA=${KTC_MODEL_DRIFT_DATA:-$HOME/.cache/cdeit-jax/ktc-model-sim-drift-v1}
KTC_MODEL_BASE=${KTC_MODEL_BASE:-runs/ktc2023_model}
KTC_MODEL_FINE=${KTC_MODEL_FINE:-runs/ktc2023_model_drift}
KTC_MODEL_ALPHA=${KTC_MODEL_ALPHA:-1}
KTC_MODEL_RUN=${KTC_MODEL_RUN:-runs/ktc2023_model_wise}
KTC_MODEL_REFINEMENT=${KTC_MODEL_REFINEMENT-objects}
KTC_MODEL_SIM=${KTC_MODEL_SIM:-"--num_train 24000 --num_valid 256 --num_test 256 --tr_splits valid,test"}
data=$KTC_MODEL_DATA drift=$KTC_MODEL_DRIFT_DATA run=$KTC_MODEL_RUN
start=$(date +%s)
# KTC_MODEL_SIM unquoted: its flags, one word each
"$BIN/python" -m cdeit_jax.simulate --config configs/ktc2023_model.py --out "$data" $KTC_MODEL_SIM
"$BIN/python" -m cdeit_jax.simulate --config configs/ktc2023_model_drift.py --out "$drift" \
  $KTC_MODEL_SIM
"$BIN/python" train.py --config configs/ktc2023_model.py --workdir "$KTC_MODEL_BASE" \
  --config.data.path="$data"
"$BIN/python" train.py --config configs/ktc2023_model_drift.py --workdir "$KTC_MODEL_FINE" \
  --config.data.path="$drift" --config.init_from="$KTC_MODEL_BASE"
"$BIN/python" -m cdeit_jax.interpolate --workdir "$KTC_MODEL_FINE" \
  --alpha "$KTC_MODEL_ALPHA" --out "$run"
"$BIN/python" -m cdeit_jax.answer_study --workdir "$run" \
  --sims "$data/valid,$drift/valid" --ktc data/ktc2023/levels --out "$run/answer_study.json"
rule=$("$BIN/python" -c "import json; print(json.load(open('$run/answer_study.json'))['metrics']['chosen'])")
"$BIN/python" -m cdeit_jax.answer_study --workdir "$run" --rules "$rule" \
  --sims "$data/test" --out "$run/answer_test.json"
"$BIN/python" -m cdeit_jax.answer_study --workdir "$run" --rules "$rule" \
  --sims "$drift/test" --out "$run/answer_test_drift.json"
ktc_heldout "$run" "$run" "$rule"
"$BIN/python" eval.py --workdir "$run" --data ktc2023_challenge \
  --data_path data/ktc2023/levels --out "$run/eval_ktc2023" \
  --config.eval.tikhonov=True --config.eval.answer_rule="$rule" \
  --config.eval.refinement="$KTC_MODEL_REFINEMENT"
"$BIN/python" -m cdeit_jax.ship --workdir "$run" --out models/ktc2023 \
  --recipe "make ktc-model (configs/ktc2023_model.py, configs/ktc2023_model_drift.py, WiSE-FT $KTC_MODEL_ALPHA)" \
  --set eval.answer_rule="$rule" --set eval.refinement="$KTC_MODEL_REFINEMENT" \
  --scores ktc2023_public="$run/eval_ktc2023/metrics.json" \
  --scores rule_study="$run/answer_study.json" \
  --scores simulated_levels="$run/answer_test.json" \
  --scores simulated_levels_drift="$run/answer_test_drift.json" \
  --scores heldout_few="$run/heldout_few.json" \
  --scores heldout_many="$run/heldout_many.json"
echo "make ktc-model: $(( $(date +%s) - start )) s (the model: models/ktc2023, rule $rule)"
