"""Process settings that make XLA:CPU runs faster; the commands apply them before JAX starts.

Measured on 2 cores (AMD EPYC with AVX-512), published model, float32, batch 2:
- glibc's malloc backed by transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`):
  XLA:CPU allocates the step's large temporaries afresh on every call, and the page faults of
  hundreds of MB of attention scores cost more than computing them (one 4,096-token score
  block: 73 ms -> 18 ms; train step 10.9 s -> 10.1 s). glibc reads tunables only at start-up,
  so the command re-executes itself once with the variable set.
- `--xla_cpu_prefer_vector_width=512` where the CPU has AVX-512 (forward + backward
  9.4 s -> 8.6 s).
- `OPENBLAS_NUM_THREADS=1`: jaxlib's LAPACK kernels (the simulator's Cholesky) call the
  OpenBLAS bundled with scipy; with its own threads on top of XLA's, simulating on 8 host
  devices ran at 6 examples/s, with one thread per call at 152 (2 host devices: 69 -> 173). XLA's
  own matrix products do not use OpenBLAS.
- `simulate=True` (`python -m cdeit_jax.simulate`): one host device per core
  (`--xla_force_host_platform_device_count`), each solving its share of the examples.
Set CDEIT_CPU_TUNING=0 to run without them. None changes results. `apply` also quiets libtpu on a
machine without a TPU (`common/libtpu_env.py`; CDEIT_LIBTPU_ENV=0 turns that off).
"""

from __future__ import annotations

import os
import platform
import sys

HUGEPAGES = "glibc.malloc.hugetlb=1"
WIDE_VECTORS = "--xla_cpu_prefer_vector_width=512"


def _has_avx512() -> bool:
  try:
    with open("/proc/cpuinfo") as fh:
      return " avx512f" in fh.read()
  except OSError:
    return False


def _cores() -> int:
  """The cores this process may run on (not the machine's, in a container or under taskset)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def _glibc() -> bool:
  return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def tuned_environment(env: dict[str, str], simulate: bool = False) -> dict[str, str]:
  """`env` with the settings added (existing values are kept and extended, never replaced)."""
  env = dict(env)
  if env.get("CDEIT_CPU_TUNING", "1") == "0":
    return env
  env.setdefault("OPENBLAS_NUM_THREADS", "1")
  if simulate and "xla_force_host_platform_device_count" not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = " ".join(
      filter(None, [env.get("XLA_FLAGS"), f"--xla_force_host_platform_device_count={_cores()}"])
    )
  if _glibc() and "glibc.malloc.hugetlb" not in env.get("GLIBC_TUNABLES", ""):
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), HUGEPAGES]))
  if _has_avx512() and "xla_cpu_prefer_vector_width" not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), WIDE_VECTORS]))
  return env


def apply(simulate: bool = False) -> None:
  """Call first thing in a command's `__main__` (before importing jax or numpy): sets the
  variables and, when the malloc setting is missing, re-executes the same command line with it."""
  from cdeit_jax.common import libtpu_env

  libtpu_env.apply()
  env = tuned_environment(os.environ, simulate)
  needs_restart = env.get("GLIBC_TUNABLES") != os.environ.get("GLIBC_TUNABLES")
  os.environ.update(env)
  if needs_restart and "jax" not in sys.modules:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)  # the same interpreter options and arguments
