"""Training and test data: the npz format, sources, grain pipelines, statistics, the simulated
distribution.

The names of `cdeit_jax.data.sources` (`NpzSource`, `ArraySource`) are also given here on first
use (PEP 562), as they were when this package was one module."""

import importlib
import importlib.util


def __getattr__(name: str):
  if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is None:
    try:
      return getattr(importlib.import_module("cdeit_jax.data.sources"), name)
    except AttributeError:
      pass
  raise AttributeError(f"module 'cdeit_jax.data' has no attribute {name!r}")
