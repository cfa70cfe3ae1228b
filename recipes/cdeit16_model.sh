#!/usr/bin/env bash
# make cdeit16-model: the model that ships for CDEIT's 16-electrode system (models/cdeit16,
# docs/checkpoints.md): simulate 24,000 training examples once (cached), twice: with label
# targets and with class targets (the same voltages); train configs/cdeit16.py 30,000 steps on
# the labels, fine-tune it 4,000 steps on the classes (configs/cdeit16_class.py), and take the
# weights half-way between the two (WiSE-FT, python -m cdeit_jax.interpolate; rerunning
# resumes each stage); fit the uncertainty's split-conformal scales on a calibration split (2,048
# class targets of simulator seed 1), evaluate on held-out simulations, the foreign
# system and UEF2017, and write the model folder with those scores (python -m cdeit_jax.ship).
# Environment (make passes what it is given): BIN (default .venv/bin), CDEIT16_DATA,
# CDEIT16_CLASS_DATA, CDEIT16_FOREIGN, CDEIT16_CALIB, CDEIT16_BASE, CDEIT16_FINE, CDEIT16_RUN,
# CDEIT16_ALPHA,
# CDEIT16_EVAL (the evaluations' flags), CDEIT16_SIM (the simulations' sizes); defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
CDEIT16_DATA=${CDEIT16_DATA:-$HOME/.cache/cdeit-jax/cdeit16-sim-v1}
CDEIT16_CLASS_DATA=${CDEIT16_CLASS_DATA:-$HOME/.cache/cdeit-jax/cdeit16-sim-class-v1}
CDEIT16_FOREIGN=${CDEIT16_FOREIGN:-$HOME/.cache/cdeit-jax/demo-foreign-class-v1}
CDEIT16_CALIB=${CDEIT16_CALIB:-$HOME/.cache/cdeit-jax/cdeit16-calib-class-v1}
CDEIT16_BASE=${CDEIT16_BASE:-runs/cdeit16}
CDEIT16_FINE=${CDEIT16_FINE:-runs/cdeit16_class}
CDEIT16_RUN=${CDEIT16_RUN:-runs/cdeit16_wise}
CDEIT16_ALPHA=${CDEIT16_ALPHA:-0.5}
CDEIT16_EVAL=${CDEIT16_EVAL:-"--config.eval.tikhonov=True --config.eval.figure=False"}
CDEIT16_SIM=${CDEIT16_SIM:-"--num_train 24000 --num_valid 256 --num_test 64 --tr_splits valid,test"}
run=$CDEIT16_RUN
start=$(date +%s)
# CDEIT16_SIM and CDEIT16_EVAL unquoted: their flags, one word each
"$BIN/python" -m cdeit_jax.simulate --out "$CDEIT16_DATA" $CDEIT16_SIM
"$BIN/python" -m cdeit_jax.simulate --out "$CDEIT16_CLASS_DATA" $CDEIT16_SIM \
  --config.simulator.phantom.target=class
"$BIN/python" -m cdeit_jax.simulate --config configs/foreign.py --out "$CDEIT16_FOREIGN" \
  --num_test 64 --config.simulator.phantom.target=class
# the calibration split of the std's split-conformal scales: 2,048 class targets of another seed
"$BIN/python" -m cdeit_jax.simulate --out "$CDEIT16_CALIB" --num_valid 2048 --tr_splits valid \
  --config.simulator.phantom.target=class --config.simulator.seed=1
"$BIN/python" train.py --config configs/cdeit16.py --workdir "$CDEIT16_BASE" \
  --config.data.path="$CDEIT16_DATA"
"$BIN/python" train.py --config configs/cdeit16_class.py --workdir "$CDEIT16_FINE" \
  --config.data.path="$CDEIT16_CLASS_DATA" --config.init_from="$CDEIT16_BASE"
"$BIN/python" -m cdeit_jax.interpolate --workdir "$CDEIT16_FINE" \
  --alpha "$CDEIT16_ALPHA" --out "$run"
"$BIN/python" eval.py --workdir "$run" --data simulated \
  --data_path "$CDEIT16_CALIB/valid" --out "$run/eval_calibration" $CDEIT16_EVAL \
  --config.eval.fit_uncertainty=True
"$BIN/python" eval.py --workdir "$run" --data simulated \
  --data_path "$CDEIT16_CLASS_DATA/test" --out "$run/eval_simulated" $CDEIT16_EVAL
"$BIN/python" eval.py --workdir "$run" --data simulated \
  --data_path "$CDEIT16_FOREIGN/test" --out "$run/eval_foreign" $CDEIT16_EVAL
"$BIN/python" eval.py --workdir "$run" --data uef2017 --data_path data/uef2017 \
  --out "$run/eval_uef2017" $CDEIT16_EVAL
"$BIN/python" -m cdeit_jax.report "$run/eval_simulated" "$run/eval_foreign" "$run/eval_uef2017"
"$BIN/python" -m cdeit_jax.ship --workdir "$run" --out models/cdeit16 \
  --recipe "make cdeit16-model (configs/cdeit16.py, configs/cdeit16_class.py, WiSE-FT $CDEIT16_ALPHA)" \
  --scores simulated="$run/eval_simulated/metrics.json" \
  --scores foreign="$run/eval_foreign/metrics.json" \
  --scores uef2017="$run/eval_uef2017/metrics.json"
echo "make cdeit16-model: $(( $(date +%s) - start )) s (the model: models/cdeit16)"
