#!/usr/bin/env bash
# make gpu-wheels: the wheels a lent GPU machine lacks (Python 3.12, no network there;
# docs/gpu.md), into wheels/ (git-ignored): carry it, then there: pip install --no-index
# --no-deps wheels/*.whl (recipes/gpu_run.sh does). Not protobuf or PyYAML: orbax-checkpoint and
# flax bring them (a second copy could clobber theirs).
# Environment (make passes what it is given): BIN (default .venv/bin), GPU_WHEELS (the
# packages); defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
GPU_WHEELS=${GPU_WHEELS:-"grain array_record cloudpickle portpicker psutil ml_collections tensorboardX tqdm"}
# GPU_WHEELS unquoted: its names, one word each
"$BIN/pip" download -q --only-binary=:all: --no-deps --python-version 3.12 -d wheels \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 $GPU_WHEELS
du -sh wheels
