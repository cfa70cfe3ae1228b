#!/usr/bin/env bash
# make gpu-reference REF=PATH: the published code for gpu-run's side-by-side stage, copied from a
# checkout of github.com/shuaikaishi/CDEIT (REF) into reference/CDEIT: git-ignored, so it travels
# with the working tree to a lent machine and is never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${REF:-}
test -f "$REF/models.py" || { echo "make gpu-reference: give REF=PATH, a checkout of the published CDEIT code (models.py, diffusion/)"; exit 2; }
rm -rf reference/CDEIT
mkdir -p reference/CDEIT
cp -r "$REF/models.py" "$REF/diffusion" reference/CDEIT/
