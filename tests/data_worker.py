"""One process of the two-process data test: `python data_worker.py PORT PID FOLDER OUT`."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

port, pid, folder, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

from cdeit_jax import config_lib  # noqa: E402
from cdeit_jax.data import pipeline, sources  # noqa: E402
from cdeit_jax.eit.layout import preset  # noqa: E402

mean, std = np.zeros((1, 16, 13)), np.ones((1, 16, 13))
src = sources.NpzSource(folder, stats=(mean, std))
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
it = iter(
  pipeline.train_dataset(
    src, global_batch=8, opts=config_lib.default_config().data, layout=preset("cdeit16")
  )
)
seen, shapes = [], []
for _ in range(len(src) // 8):
  host = next(it)
  seen += host["index"].tolist()
  g = pipeline.to_global(host, mesh)
  shapes.append(
    [
      list(g["cond"].shape),
      len(g["cond"].addressable_shards),
      g["cond"].sharding.spec == jax.sharding.PartitionSpec("data"),
    ]
  )
  # the global array really spans both processes: sum its indices with a collective
  total = jax.jit(
    lambda a: a.sum(), out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  )(g["index"])
  shapes[-1].append(int(total))
ev_idx, ev_mask = pipeline.eval_indices(len(src), 8)
with open(out, "w") as fh:
  json.dump(
    {
      "seen": seen,
      "shapes": shapes,
      "eval": ev_idx[ev_mask.astype(bool)].tolist(),
      "devices": jax.device_count(),
    },
    fh,
  )
jax.distributed.shutdown()
