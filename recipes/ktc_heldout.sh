#!/usr/bin/env bash
# make ktc-heldout: a KTC2023 model on the held-out shape families (docs/ktc2023.md): targets of
# shapes its training never draws (letters, blobs, thin shapes, concave outlines, touching pairs),
# made once (cached) for configs/ktc2023_model.py's system, 100 with 1-4 objects (few/: levels
# 1-4) and 100 with 3-4 of both classes (many/: levels 5-7), scored per level for the model's
# answer rules (KTC_HELD_RULES: one rule; default: every candidate) into
# KTC_HELD_OUT/heldout_{few,many}.json. A test: nothing is chosen on it.
# Environment (make passes what it is given): BIN (default .venv/bin), KTC_HELD (the families),
# KTC_HELD_MODEL, KTC_HELD_OUT, KTC_HELD_RULES; defaults below. recipes/ktc_model.sh sources
# this file for `ktc_heldout` alone.
set -euo pipefail
BIN=${BIN:-.venv/bin}
KTC_HELD=${KTC_HELD:-$HOME/.cache/cdeit-jax/ktc-heldout-v1}

# ktc_heldout MODEL OUT [RULES]: the families made once, then both groups scored
ktc_heldout() {
  local model=$1 out=$2 rules=${3:-}
  test -f "$KTC_HELD/heldout.json" || "$BIN/python" -m cdeit_jax.heldout_families \
    --config configs/ktc2023_model.py --out "$KTC_HELD" --num 100
  mkdir -p "$out"
  for group in few many; do
    "$BIN/python" -m cdeit_jax.answer_study --workdir "$model" --sims "$KTC_HELD/$group" \
      --num 100 ${rules:+--rules "$rules"} --out "$out/heldout_$group.json" || exit 1
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
  cd "$(dirname "$0")/.."
  KTC_HELD_MODEL=${KTC_HELD_MODEL:-models/ktc2023}
  KTC_HELD_OUT=${KTC_HELD_OUT:-runs/ktc2023_heldout}
  start=$(date +%s)
  ktc_heldout "$KTC_HELD_MODEL" "$KTC_HELD_OUT" "${KTC_HELD_RULES:-}"
  echo "make ktc-heldout: $(( $(date +%s) - start )) s (levels 1-4: $KTC_HELD_OUT/heldout_few.json, 5-7: heldout_many.json)"
fi
