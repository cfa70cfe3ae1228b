#!/usr/bin/env bash
# make device-model: your own device (docs/your_device.md): calibrate it from its reference file
# (gain, contact impedance and electrode width fitted to the empty tank, each with the range the
# frame allows; WIDTH_DEG=10.2, or ELECTRODE_CM=2.5 TANK_CM=28, holds a width you know;
# CALIBRATE: more flags, e.g. --patterns 0-15), simulate its training set with the measuring
# system drawn across the calibration's ranges, and fine-tune models/cdeit16 for it
# (configs/device.py; DEVICE_CONFIG=configs/device_scratch.py trains from random weights; TRAIN:
# more train.py flags, e.g. --config.model.current_carrying=use) into RUN; rerunning resumes.
# Then: python -m cdeit_jax.reconstruct --workdir RUN --frames F --reference REF --out O
# Environment (make passes what it is given): BIN (default .venv/bin), DEVICE (required), RUN,
# WIDTH_DEG, ELECTRODE_CM, TANK_CM, CALIBRATE, DEVICE_CONFIG, TRAIN; defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
DEVICE=${DEVICE:-}
RUN=${RUN:-runs/device}
DEVICE_CONFIG=${DEVICE_CONFIG:-configs/device.py}
test -n "$DEVICE" || { echo "make device-model: give DEVICE=ref.mat (the device's reference file)"; exit 2; }
start=$(date +%s)
# CALIBRATE and TRAIN unquoted: their flags, one word each
"$BIN/python" -m cdeit_jax.calibrate --device "$DEVICE" --out "$RUN/device.npz" \
  ${WIDTH_DEG:+--width_deg "$WIDTH_DEG"} ${ELECTRODE_CM:+--electrode_cm "$ELECTRODE_CM"} \
  ${TANK_CM:+--tank_cm "$TANK_CM"} ${CALIBRATE:-}
"$BIN/python" -m cdeit_jax.simulate --config "$DEVICE_CONFIG:$RUN/device.npz" \
  --out "$RUN/data" --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test
"$BIN/python" train.py --config "$DEVICE_CONFIG:$RUN/device.npz" --workdir "$RUN" \
  --config.data.path="$RUN/data" ${TRAIN:-}
echo "make device-model: $(( $(date +%s) - start )) s (the model: $RUN)"
