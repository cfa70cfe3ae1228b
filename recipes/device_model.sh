#!/usr/bin/env bash
# make device-model: your own device (docs/your_device.md): calibrate it from its reference file
# (gain, contact impedance and electrode width fitted to the empty tank, each with the range the
# frame allows; WIDTH_DEG=10.2, or ELECTRODE_CM=2.5 TANK_CM=28, holds a width you know;
# CALIBRATE: more flags, e.g. --patterns 0-15); a device on models/cdeit16's electrodes then reads
# its frames translated into that model's (below); any other: simulate its training set with
# the measuring system drawn across the calibration's ranges, and fine-tune models/cdeit16 for it
# (configs/device.py; DEVICE_CONFIG=configs/device_scratch.py trains from random weights; TRAIN:
# more train.py flags, e.g. --config.model.current_carrying=use) into RUN; rerunning resumes.
# Then: python -m cdeit_jax.reconstruct --workdir RUN --frames F --reference REF --out O
# Environment (make passes what it is given): BIN (default .venv/bin), DEVICE (required), RUN,
# WIDTH_DEG, ELECTRODE_CM, TANK_CM, CALIBRATE, DEVICE_PATH (auto or fine_tune), DEVICE_CONFIG,
# TRAIN; defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
DEVICE=${DEVICE:-}
RUN=${RUN:-runs/device}
DEVICE_CONFIG=${DEVICE_CONFIG:-configs/device.py}
test -n "$DEVICE" || { echo "make device-model: give DEVICE=ref.mat (the device's reference file)"; exit 2; }
start=$(date +%s)
# A RUN that holds a trained run's checkpoints resumes it; one that holds a translated model is
# not trained into.
DEVICE_PATH=${DEVICE_PATH:-auto}
case "$DEVICE_PATH" in auto | fine_tune) ;; *)
  echo "make device-model: DEVICE_PATH=$DEVICE_PATH: give auto or fine_tune"; exit 2 ;; esac
if [ "$DEVICE_PATH" = fine_tune ] && [ -e "$RUN/translation.npz" ]; then
  echo "make device-model: $RUN holds a translated model (translation.npz); give another RUN"
  exit 2
fi
# A RUN is one device's, made here: a run of anything else in it (a training, an import) is
# refused before the calibration writes RUN/device.npz or anything is simulated.
if [ -e "$RUN/translation.npz" ] && [ -e "$RUN/checkpoints" ]; then
  echo "make device-model: $RUN holds a translated model (translation.npz) and checkpoints/ of" \
    "another model beside it, which no reader of the RUN takes; give a new RUN (or move" \
    "$RUN/checkpoints away)"
  exit 2
fi
if [ ! -e "$RUN/device.npz" ] && { [ -e "$RUN/checkpoints" ] || [ -e "$RUN/metrics.jsonl" ]; }; then
  echo "make device-model: $RUN holds a run that make device-model did not make (checkpoints/" \
    "or metrics.jsonl, and no device.npz); give a new RUN for the device"
  exit 2
fi
# CALIBRATE and TRAIN unquoted: their flags, one word each
"$BIN/python" -m cdeit_jax.calibrate --device "$DEVICE" --out "$RUN/device.npz" \
  ${WIDTH_DEG:+--width_deg "$WIDTH_DEG"} ${ELECTRODE_CM:+--electrode_cm "$ELECTRODE_CM"} \
  ${TANK_CM:+--tank_cm "$TANK_CM"} ${CALIBRATE:-}
# A device on models/cdeit16's electrodes (16 at its places, any currents and pairs) reads its frames
# translated into the model's 208 values (python -m cdeit_jax.translate; exit status 3: not on
# those electrodes). DEVICE_PATH=fine_tune trains a model for it instead, as for any other device.
if [ "$DEVICE_PATH" = auto ] && [ ! -d "$RUN/checkpoints" ]; then
  status=0
  "$BIN/python" -m cdeit_jax.translate --device "$RUN/device.npz" --model models/cdeit16 \
    --out "$RUN" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "make device-model: $(( $(date +%s) - start )) s (the model: $RUN, translated)"
    exit 0
  fi
  test "$status" -eq 3 || exit "$status"
fi
"$BIN/python" -m cdeit_jax.simulate --config "$DEVICE_CONFIG:$RUN/device.npz" \
  --out "$RUN/data" --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
"$BIN/python" train.py --config "$DEVICE_CONFIG:$RUN/device.npz" --workdir "$RUN" \
  --config.data.path="$RUN/data" ${TRAIN:-}
echo "make device-model: $(( $(date +%s) - start )) s (the model: $RUN)"
