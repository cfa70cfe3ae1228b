#!/usr/bin/env bash
# The split-conformal calibration of models/cdeit16's uncertainty (docs/evaluation.md), without
# writing into the model folder: simulate its calibration split (recipes/cdeit16_model.sh's: 2,048
# class targets of simulator seed 1) and fit the scales on it (OUT/fit/uncertainty.json, what the
# shipped model carries); then apply them to fresh simulations of its own distribution under a
# seed drawn now (printed), to the foreign system (configs/foreign.py) and to UEF2017, beside
# Tikhonov and GREIT, and print the coverages. The model folder takes a new fit with
#   python -m cdeit_jax.ship --out models/cdeit16 --calibration OUT/fit/uncertainty.json \
#     --scores simulated=... --scores foreign=... --scores uef2017=...  (eval.py's metrics.json)
# Environment: BIN (default .venv/bin), OUT (default runs/cdeit16_intervals), HELD (examples, 256),
# CALIB (calibration examples, 2048).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/cdeit16_intervals}
HELD=${HELD:-256}
CALIB=${CALIB:-2048}
SEED=$("$BIN/python" -c "import secrets; print(secrets.randbelow(2**31))")
echo "held-out simulations: seed $SEED"
CLASS=--config.simulator.phantom.target=class
"$BIN/python" -m cdeit_jax.simulate --out "$OUT/data_valid" --num_valid "$CALIB" --tr_splits valid \
  $CLASS --config.simulator.seed=1
"$BIN/python" -m cdeit_jax.simulate --out "$OUT/data_held_$SEED" --num_test "$HELD" --tr_splits test \
  $CLASS --config.simulator.seed="$SEED"
"$BIN/python" -m cdeit_jax.simulate --config configs/foreign.py --out "$OUT/data_foreign" \
  --num_test 64 $CLASS
E=("$BIN/python" eval.py --workdir models/cdeit16 --config.eval.figure=False)
"${E[@]}" --data simulated --data_path "$OUT/data_valid/valid" --out "$OUT/fit" \
  --config.eval.fit_uncertainty=True
A=(--config.eval.calibration="$OUT/fit/uncertainty.json" --config.eval.tikhonov=True
  --config.eval.greit=True)
"${E[@]}" --data simulated --data_path "$OUT/data_held_$SEED/test" --out "$OUT/held" "${A[@]}"
"${E[@]}" --data simulated --data_path "$OUT/data_foreign/test" --out "$OUT/foreign" "${A[@]}"
"${E[@]}" --data uef2017 --data_path data/uef2017 --out "$OUT/uef2017" "${A[@]}"
"$BIN/python" -m cdeit_jax.report "$OUT/held" "$OUT/foreign" "$OUT/uef2017"
