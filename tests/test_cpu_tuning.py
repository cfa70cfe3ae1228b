"""The XLA:CPU process options: added without clobbering, switchable off, applied by re-exec."""

import os
import subprocess
import sys

import pytest

from cdeit_jax.common import cpu_tuning

linux_glibc = pytest.mark.skipif(not cpu_tuning._glibc(), reason="glibc tunables need glibc")


@linux_glibc
def test_settings_extend_what_is_there():
  env = cpu_tuning.tuned_environment(
    {
      "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    }
  )
  assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  assert env["XLA_FLAGS"].startswith("--xla_force_host_platform_device_count=8")
  assert cpu_tuning.tuned_environment(env) == env  # idempotent
  assert cpu_tuning.tuned_environment({"CDEIT_CPU_TUNING": "0"}) == {"CDEIT_CPU_TUNING": "0"}


def test_one_blas_thread_and_a_host_device_per_core_for_simulation():
  env = cpu_tuning.tuned_environment({})
  assert env["OPENBLAS_NUM_THREADS"] == "1" and "device_count" not in env.get("XLA_FLAGS", "")
  assert cpu_tuning.tuned_environment({"OPENBLAS_NUM_THREADS": "4"})["OPENBLAS_NUM_THREADS"] == "4"
  sim = cpu_tuning.tuned_environment({}, simulate=True)
  assert (
    f"--xla_force_host_platform_device_count={len(os.sched_getaffinity(0))}" in sim["XLA_FLAGS"]
  )
  given = {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}
  assert "count=3" in cpu_tuning.tuned_environment(given, simulate=True)["XLA_FLAGS"]
  assert "count=2" not in cpu_tuning.tuned_environment(given, simulate=True)["XLA_FLAGS"]


def test_wide_vectors_only_with_avx512():
  """Against numpy's own CPU feature detection (CPUID at import), not /proc/cpuinfo's text."""
  try:
    from numpy._core._multiarray_umath import __cpu_features__ as features
  except ImportError:
    pytest.skip("this numpy does not expose its CPU features")
  env = cpu_tuning.tuned_environment({})
  assert ("--xla_cpu_prefer_vector_width=512" in env.get("XLA_FLAGS", "")) == features["AVX512F"]


@linux_glibc
def test_apply_reexecutes_once_with_the_same_arguments():
  code = (
    "import os, sys; from cdeit_jax.common import cpu_tuning; print('run', sys.argv[1:], "
    "flush=True); cpu_tuning.apply(); print(os.environ['GLIBC_TUNABLES'])"
  )
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "CDEIT_CPU_TUNING")}
  r = subprocess.run(
    [sys.executable, "-c", code, "a", "--b"],
    env=env,
    capture_output=True,
    text=True,
    cwd=os.path.dirname(os.path.dirname(__file__)),
    timeout=60,
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines() == ["run ['a', '--b']", "run ['a', '--b']", "glibc.malloc.hugetlb=1"]
