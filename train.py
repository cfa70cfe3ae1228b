"""Train CDEIT data-parallel on every device of every host.

  python train.py --config configs/v5e8.py --workdir DIR [--config.key=value ...]
  python train.py --config configs/test.py --workdir /tmp/run          # tiny, CPU, shipped data
  python train.py --config configs/v5e8.py --compile_topology v5e-8 --workdir DIR  # fits? (no TPU)
  python train.py --config configs/gpu.py --compile_topology h100-8 --workdir DIR  # (no GPU)

Every config key with its default and meaning: `python train.py [--config FILE] --config_help`
(docs/config.md).

A workdir that holds a checkpoint resumes from it. Explicit clusters (GPUs, CPUs):
  --coordinator_address HOST:PORT --num_processes N --process_id I
On Cloud TPU pods and SLURM jobs jax.distributed.initialize() finds the cluster by itself.
"""

import sys
import time

if __name__ == "__main__":
  STARTED = time.perf_counter()  # config.time_budget_s counts from here (imports included)
  from cdeit_jax.common import cpu_tuning

  cpu_tuning.apply()  # before jax starts (may re-execute this command once)

from absl import flags
from ml_collections import config_flags

from cdeit_jax import cli

config_flags.DEFINE_config_file("config", None, "config file (configs/*.py)", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, metrics.jsonl and TensorBoard logs go here")
flags.DEFINE_string(
  "compile_topology",
  None,
  "compile only, for a TPU topology such as v5e-8 (any machine with libtpu: pip install -e "
  "'.[tpu]') or one host of NVIDIA GPUs such as h100-8, h200-1 (any machine with JAX's CUDA "
  "plugin: pip install -e '.[cuda-aot]'); writes WORKDIR/compile.json and exits 0 when the "
  "step fits, 1 when not",
)
cli.define_cluster_flags()
cli.define_cache_flag()
cli.define_config_help()
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from cdeit_jax import config_lib

  config_lib.none_strings(FLAGS.config)
  if FLAGS.compile_topology is not None:  # exit 0: fits, 1: does not fit, 2: bad input
    from cdeit_jax.common import compile_cache
    from cdeit_jax.train import aot

    # compile-only executables cannot be loaded back from the persistent cache (jax warns on
    # every read), and keeping them would only fill it
    compile_cache.enable("none")
    from cdeit_jax.common.errors import CdeitError

    try:
      say = lambda text: print(text, flush=True)  # each program as it starts (a log file too)
      report = aot.compile_check(FLAGS.config, FLAGS.compile_topology, FLAGS.workdir, say)
    except CdeitError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    sys.exit(0 if report["fits"] else 1)
  cli.init_distributed()
  from cdeit_jax.train import train_loop

  train_loop.train(FLAGS.config, FLAGS.workdir, started=STARTED)


if __name__ == "__main__":
  cli.run(main)
