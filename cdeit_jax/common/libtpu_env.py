"""libtpu on a machine without a TPU: quiet, and never in another process's way.

The `tpu` extra installs libtpu, and JAX then loads it in every process (it tries the TPU backend
before the CPU), also on a laptop or a CPU VM where it serves only the compile-only check
(`train.py --compile_topology v5e-8`). There libtpu asks the cloud metadata server for its
accelerator type and worker hostnames, gets none, and prints a block that reads like a crash
(`Failed to find host bounds ...`, `E0000 ... INVALID_ARGUMENT: Error: unexpected worker hostname
...`), and JAX logs `Unable to initialize backend 'tpu'`. On such a machine (no Google PCI device:
JAX's own test of a TPU) the commands set, before JAX starts and only where the user set none:

- `TPU_SKIP_MDS_QUERY=1`, `TPU_WORKER_HOSTNAMES=localhost`, `TPU_HOST_BOUNDS=1,1,1`: one local
  host, nothing to ask the metadata server (each of the two messages needs one of the last two);
- `ALLOW_MULTIPLE_LIBTPU_LOAD=1`: libtpu's lock file (`/tmp/libtpu_lockfile`) guards TPU chips
  against two processes; with no chips it only made a compile-only check fail while any other JAX
  process of the machine ran.

Compile-only devices of any topology are made as before (tests/test_aot.py). On a TPU VM nothing
is changed. CDEIT_LIBTPU_ENV=0 turns this off.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor (as jax._src.hardware_utils reads it)
QUIET = {
  "TPU_SKIP_MDS_QUERY": "1",
  "TPU_WORKER_HOSTNAMES": "localhost",
  "TPU_HOST_BOUNDS": "1,1,1",
  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
# set by a user or a TPU VM's own environment: then nothing is changed
TPU_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID")


def tpu_chips_present() -> bool:
  """Whether the machine has a Google PCI device (a TPU chip) or a TPU device node; when in
  doubt (no /sys to read), True: nothing is changed."""
  if not os.path.isdir("/sys/bus/pci/devices"):
    return True
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(vendor) as fh:
        if fh.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      return True
  return bool(glob.glob("/dev/accel*"))


def libtpu_installed() -> bool:
  try:
    return importlib.util.find_spec("libtpu") is not None
  except (ImportError, ValueError):
    return False


def applies(env: dict[str, str]) -> bool:
  """Whether this process runs libtpu on a machine without a TPU (and may quiet it)."""
  return (
    env.get("CDEIT_LIBTPU_ENV", "1") != "0"
    and not any(env.get(k) for k in TPU_VARIABLES)
    and libtpu_installed()
    and not tpu_chips_present()
  )


def quiet_environment(env: dict[str, str]) -> dict[str, str]:
  """`env` with `QUIET` added where `applies` (a value the user set is kept)."""
  env = dict(env)
  if applies(env):
    for k, v in QUIET.items():
      env.setdefault(k, v)
  return env


def no_tpu_here() -> bool:
  """Whether `quiet_environment` set this process up: libtpu without a TPU."""
  return os.environ.get("TPU_WORKER_HOSTNAMES") == QUIET["TPU_WORKER_HOSTNAMES"] and (
    os.environ.get("TPU_HOST_BOUNDS") == QUIET["TPU_HOST_BOUNDS"]
  )


class _NoTpuBackend(logging.Filter):
  """Drops JAX's `Unable to initialize backend 'tpu'` (expected where there is no TPU)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Unable to initialize backend 'tpu'")


def apply() -> None:
  """Before JAX starts (the commands' first lines): the variables above, and JAX's log line of
  the missing TPU dropped, on a machine without a TPU (with libtpu, or without it: a CPU or GPU
  install, where JAX still tries the TPU backend and logs that it found none)."""
  os.environ.update(quiet_environment(os.environ))
  quiet = os.environ.get("CDEIT_LIBTPU_ENV", "1") != "0"
  logger = logging.getLogger("jax._src.xla_bridge")
  if no_tpu_here() or (quiet and not tpu_chips_present()):
    if not any(isinstance(f, _NoTpuBackend) for f in logger.filters):  # applied once
      logger.addFilter(_NoTpuBackend())
