"""Train CDEIT data-parallel on every device of every host.

  python train.py --config configs/v5e8.py --workdir DIR [--config.key=value ...]
  python train.py --config configs/test.py --workdir /tmp/run          # tiny, CPU, shipped data
  python train.py --config configs/v5e8.py --compile_topology v5e-8 --workdir DIR  # fits? (no TPU)

A workdir that holds a checkpoint resumes from it. Explicit clusters (GPUs, CPUs):
  --coordinator_address HOST:PORT --num_processes N --process_id I
On Cloud TPU pods and SLURM jobs jax.distributed.initialize() finds the cluster by itself.
"""

import logging
import os
import sys

if __name__ == "__main__":
  from cdeit_jax import cpu_tuning
  cpu_tuning.apply()  # before jax starts (may re-execute this command once)

from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "config file (configs/*.py)", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, metrics.jsonl and TensorBoard logs go here")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (explicit clusters)")
flags.DEFINE_integer("num_processes", None, "number of processes (explicit clusters)")
flags.DEFINE_integer("process_id", None, "this process's id (explicit clusters)")
flags.DEFINE_string("compile_topology", None, "compile only, for a TPU topology such as v5e-8 "
                    "(any machine with libtpu: pip install -e '.[tpu]'); writes "
                    "WORKDIR/compile.json and exits 0 when the step fits, 1 when not")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def _auto_cluster() -> bool:
  """Multi-host environments where jax.distributed.initialize() needs no arguments."""
  env = os.environ
  return (len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
          or int(env.get("SLURM_NTASKS", "1")) > 1
          or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1)


def init_distributed() -> None:
  import jax
  given = [FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id]
  if any(v is not None for v in given):
    if any(v is None for v in given):
      raise app.UsageError("--coordinator_address, --num_processes and --process_id go together")
    if FLAGS.num_processes > 1 and (os.environ.get("JAX_PLATFORMS", "") == "cpu"):
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  elif _auto_cluster():
    jax.distributed.initialize()


def main(argv):
  del argv
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO
  if FLAGS.compile_topology:
    from cdeit_jax import aot
    try:
      report = aot.compile_check(FLAGS.config, FLAGS.compile_topology, FLAGS.workdir)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    sys.exit(0 if report["fits"] else 1)
  init_distributed()
  from cdeit_jax import trainer
  try:
    trainer.train(FLAGS.config, FLAGS.workdir)
  except (trainer.NonFiniteLoss, ValueError, FileNotFoundError, MemoryError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
