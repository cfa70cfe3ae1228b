"""`python -m cdeit_jax.challenge`, the linearised answers' own command of earlier versions: the
challenge has one command now, eval.py, which gives those answers without a model; running or
importing this module says so in one line."""

import sys

MOVED = (
  "python -m cdeit_jax.challenge is now eval.py's: python eval.py --data ktc2023_challenge "
  "--data_path DIR --out OUT (no --workdir: the linearised answers; docs/ktc2023.md); the "
  "functions are in cdeit_jax.infer.challenge"
)

if __name__ == "__main__":
  print(f"error: {MOVED}", file=sys.stderr)
  sys.exit(2)
raise ImportError(MOVED)
