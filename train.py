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


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a missing config file or an unknown config key reported as one
  line (ml_collections raises them, some only when the config is first read, as OSError and
  KeyError with long tracebacks)."""
  try:
    rest = FLAGS(argv)
    if FLAGS.config is not None:
      FLAGS.config.keys()  # config_flags defers a failed load to the first access
    return rest
  except flags.Error as e:
    print(f"error: {e}\nPass --help for the flags.", file=sys.stderr)
  except OSError as e:
    path = FLAGS["config"].config_filename if "config" in FLAGS else None
    if path and not os.path.isfile(path.split(":")[0]):
      print(f"error: --config {path}: no such file (the configs are in configs/)", file=sys.stderr)
    else:
      print(f"error: --config: {' '.join(str(e).split())}", file=sys.stderr)
  except KeyError as e:
    text = " ".join(str(e.args[0] if e.args else e).split())
    bad = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    print(f"error: {', '.join(bad)}: no such config key: {text}", file=sys.stderr)
  sys.exit(2)


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
  from cdeit_jax import config_lib
  config_lib.none_strings(FLAGS.config)
  init_distributed()
  from cdeit_jax import trainer, workdir_lock
  try:
    trainer.train(FLAGS.config, FLAGS.workdir)
  except (trainer.NonFiniteLoss, ValueError, FileNotFoundError, MemoryError,
          workdir_lock.WorkdirBusy) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
