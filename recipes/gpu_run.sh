#!/usr/bin/env bash
# make gpu-run on a lent GPU machine (its own Python with jax, flax, orbax and torch; no network,
# no .venv): the wheels `make gpu-wheels` put in WHEELS (default wheels/, carried with the working
# tree) installed beside that Python, then python3 -m cdeit_jax.gpu_run. Needs no make:
#   bash recipes/gpu_run.sh OUT [cdeit_jax.gpu_run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?give OUT, the folder of the files that come back}
shift
wheels=${WHEELS:-wheels}
ls "$wheels"/*.whl >/dev/null || { echo "gpu_run.sh: no wheels in $wheels (make gpu-wheels here, then carry it)"; exit 2; }
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .gpu-site "$wheels"/*.whl
export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
# the install counts in the 9 minutes
exec python3 -m cdeit_jax.gpu_run --out "$out" --spent-s $(( $(date +%s) - start )) "$@"
