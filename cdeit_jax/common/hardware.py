"""Peak dense bfloat16 matmul throughput per device kind, for achieved-FLOP/s fractions (MFU);
where no peak is known (CPUs differ machine to machine), the machine's own matmul rate, timed."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

# TFLOP/s per device (one TPU core as JAX sees it; one GPU), dense bf16, vendor figures.
PEAK_BF16_TFLOPS = {
  "TPU v4": 275.0,
  "TPU v5 lite": 197.0,  # v5e
  "TPU v5e": 197.0,
  "TPU v5p": 459.0,
  "TPU v5": 459.0,
  "TPU v6 lite": 918.0,  # v6e (Trillium)
  "TPU v6e": 918.0,
  "NVIDIA A100": 312.0,
  "NVIDIA H100": 989.0,  # SXM; PCIe parts are lower
  "NVIDIA H200": 989.0,
}


def peak_tflops(chip: jax.Device | None = None) -> float | None:
  """Peak bf16 TFLOP/s of the JAX device `chip` (default: the first), or None where unknown
  (CPU)."""
  kind = (chip or jax.devices()[0]).device_kind
  for name in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
    if kind.startswith(name) or name in kind:
      return PEAK_BF16_TFLOPS[name]
  return None


def matmul_gflops(n: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
  """XLA's n^3 matmul rate on the first device (GFLOP/s, best of `repeats`): the roof a
  benchmark's achieved FLOP/s is compared with in the same run where `peak_tflops` is None
  (float32), and on an accelerator the rate it reaches beside its vendor's peak (bfloat16)."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  f = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best / 1e9
