"""`python -m cdeit_jax.export`: a trained run, or a model folder, as one self-describing file.

  python -m cdeit_jax.export --workdir runs/ktc2023_gpu --out ktc2023_gpu.safetensors
  python -m cdeit_jax.convert --checkpoint ktc2023_gpu.safetensors --workdir runs/imported

The run's best validated step (or --step) is written with its EMA weights, its checkpoint
metadata (config, the measuring system as arrays, normalisation statistics, calibration), how it
was trained (steps, seconds, machine: what `python -m cdeit_jax.ship` records) and its
uncertainty scale, with a SHA-256 over all of it (`checkpoints.model_file`). `convert` turns the
file back into a workdir that eval.py, reconstruct, ship and `config.init_from` take; a truncated
or altered file is refused in one line. One file is how a model is shared, and how one comes
back from a machine that returns a few flat files (make gpu-run). The work is
`infer.shipping.export`'s.
"""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from cdeit_jax.common import logs
  from cdeit_jax.infer import shipping

  logs.console()
  got = shipping.export(FLAGS.workdir, FLAGS.out, FLAGS.step)
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
