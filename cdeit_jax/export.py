"""`python -m cdeit_jax.export`: a trained run, or a model folder, as one self-describing file.

  python -m cdeit_jax.export --workdir runs/ktc2023_gpu --out ktc2023_gpu.safetensors
  python -m cdeit_jax.convert --checkpoint ktc2023_gpu.safetensors --workdir runs/imported

The run's best validated step (or --step) is written with its EMA weights, its checkpoint
metadata (config, the measuring system as arrays, normalisation statistics, calibration), how it
was trained (steps, seconds, machine: what `python -m cdeit_jax.ship` records) and its
uncertainty scale, with a SHA-256 over all of it (`checkpoints.model_file`). `convert` turns the
file back into a workdir that eval.py, reconstruct, ship and `config.init_from` take; a truncated
or altered file is refused in one line. One file is how a model is shared, and how one comes
back from a machine that returns a few flat files (make gpu-run).
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import flags

FLAGS = flags.FLAGS


def export(workdir: str, out: str, step: int | None = None) -> dict:
  """Write the model file `out` of the run at `workdir` (module docstring); returns
  {path, sha256, step, bytes, params}."""
  from flax import nnx

  from cdeit_jax import ship
  from cdeit_jax.checkpoints import loading, model_file, reader, shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.infer import run_opening

  shipped.refuse_write(out, "--out")
  fileio.refuse_own_input(out, "--out", [("--workdir", workdir)])
  # a regular file or a new one, in a folder that exists; a model file is replaced, nothing else
  fileio.output_file(out, "--out", model_file.is_model_file, model_file.WHAT)
  with reader.open_run(workdir, step) as run:
    meta, skipped = run.first_readable()
    loaded = run.load(
      loading.resolve(meta.config, meta.record), weights="ema", passed=skipped, weights_only=True
    )
    meta = loaded.meta
    scale = fileio.read_text(run_opening.calibration_file(run, meta.step))
    where = run.workdir
  arrays = {
    "/".join(map(str, path)): np.asarray(v.get_value(), np.float32)
    for path, v in nnx.to_flat_state(loaded.model)
  }
  record = {
    "meta": {**meta.record, "weights": ["ema"]},
    "training": ship.training_of(where, meta),
    "uncertainty": scale,
    "exported": {
      "from": f"{os.path.abspath(where)} step {meta.step} (EMA weights; {loaded.reason})",
      "date": time.strftime("%Y-%m-%d %H:%M:%S"),
      "machine": ship.machine(),
    },
  }
  sha = model_file.write(out, arrays, record)
  return {
    "path": out,
    "sha256": sha,
    "step": meta.step,
    "bytes": fileio.path(out).stat().length,
    "params": int(sum(a.size for a in arrays.values())),
  }


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax.common import logs

  logs.console()
  got = export(FLAGS.workdir, FLAGS.out, FLAGS.step)
  print(
    f"exported step {got['step']} of {FLAGS.workdir} to {got['path']}: {got['params']:,} "
    f"parameters, {got['bytes'] / 2**20:.2f} MiB, sha256 {got['sha256'][:16]}..."
  )


if __name__ == "__main__":
  from cdeit_jax import cli

  flags.DEFINE_string("workdir", None, "the trained run (or a model folder)", required=True)
  flags.DEFINE_string("out", None, "the model file to write (NAME.safetensors)", required=True)
  flags.DEFINE_integer("step", None, "the step to export (default: the best validated)")
  cli.run(main)
