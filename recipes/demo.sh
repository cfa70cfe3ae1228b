#!/usr/bin/env bash
# The embedded default (make demo-model, then make demo): simulate a training set once (cached),
# whose measuring system is drawn per example (config.simulator.system), and a foreign system's
# test set (configs/foreign.py); train the small physics-informed CDEIT of configs/demo.py on 2
# CPU cores; fit the uncertainty's split-conformal scales on the validation split; evaluate it
# (mean of 8 samples) on held-out simulations, the foreign system and the real UEF2017 tank cases
# beside Tikhonov, GREIT and the empty image; print the table.
#   recipes/demo.sh model    # make demo-model: the data sets and the training run
#   recipes/demo.sh eval     # make demo: the evaluations and the table (after `model`)
#   recipes/demo.sh moving   # make moving-demo: a moving sequence reconstructed by the model
# Environment (make passes what it is given): BIN (default .venv/bin), DEMO_DATA, DEMO_FOREIGN,
# DEMO_RUN, DEMO_EVAL (the evaluations' flags), MOVING (moving's folder); defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
DEMO_DATA=${DEMO_DATA:-$HOME/.cache/cdeit-jax/demo-sim-v3}
DEMO_FOREIGN=${DEMO_FOREIGN:-$HOME/.cache/cdeit-jax/demo-foreign-v1}
DEMO_RUN=${DEMO_RUN:-runs/demo}
DEMO_EVAL=${DEMO_EVAL:-"--config.eval.tikhonov=True --config.eval.greit=True --config.sampling.num_samples=8"}
MOVING=${MOVING:-$DEMO_RUN/moving}

# The demo model: its training set (cached), the foreign system's test set, the training run
# (rerunning resumes, or finds it finished).
model() {
  local start
  start=$(date +%s)
  "$BIN/python" -m cdeit_jax.simulate --out "$DEMO_DATA" --num_train 3000 --num_valid 64 \
    --num_test 64 --tr_splits valid,test
  "$BIN/python" -m cdeit_jax.simulate --config configs/foreign.py --out "$DEMO_FOREIGN" \
    --num_test 64
  "$BIN/python" train.py --config configs/demo.py --workdir "$DEMO_RUN" \
    --config.data.path="$DEMO_DATA"
  echo "make demo-model: $(( $(date +%s) - start )) s"
}

# The evaluations (DEMO_EVAL unquoted: its flags, one word each) and the table.
evaluate() {
  local start
  start=$(date +%s)
  "$BIN/python" eval.py --workdir "$DEMO_RUN" --data simulated --data_path "$DEMO_DATA/valid" \
    --out "$DEMO_RUN/eval_valid" $DEMO_EVAL --config.eval.fit_uncertainty=True \
    --config.eval.figure=False
  "$BIN/python" eval.py --workdir "$DEMO_RUN" --data simulated --data_path "$DEMO_DATA/test" \
    --out "$DEMO_RUN/eval_simulated" $DEMO_EVAL
  "$BIN/python" eval.py --workdir "$DEMO_RUN" --data simulated --data_path "$DEMO_FOREIGN/test" \
    --out "$DEMO_RUN/eval_foreign" $DEMO_EVAL
  "$BIN/python" eval.py --workdir "$DEMO_RUN" --data uef2017 --data_path data/uef2017 \
    --out "$DEMO_RUN/eval_uef2017" $DEMO_EVAL
  "$BIN/python" -m cdeit_jax.report "$DEMO_RUN/eval_simulated" "$DEMO_RUN/eval_foreign" \
    "$DEMO_RUN/eval_uef2017"
  echo "make demo: evaluations $(( $(date +%s) - start )) s (figures: $DEMO_RUN/eval_*/reconstructions.png)"
}

# A moving sequence as a device records it (a reference frame, then 90 frames: two lung-like
# regions filling and emptying, a conductive disc going round the wall and across the centre),
# reconstructed by the demo model (trained first if there is none) into frames.npz/.mat, a
# montage and the GIF shown in the README (docs/moving_demo.gif).
moving() {
  test -d "$DEMO_RUN/checkpoints" || model
  "$BIN/python" -m cdeit_jax.sequence --out "$MOVING/sequence.npz"
  "$BIN/python" -m cdeit_jax.reconstruct --workdir "$DEMO_RUN" --frames "$MOVING/sequence.npz" \
    --out "$MOVING" --config.sampling.num_samples=4
  echo "make moving-demo: $MOVING/frames.gif, $MOVING/montage.png"
}

case ${1:-} in
  model) model ;;
  eval) evaluate ;;
  moving) moving ;;
  *)
    echo "recipes/demo.sh: give model (make demo-model), eval (make demo) or moving (make moving-demo)" >&2
    exit 2
    ;;
esac
