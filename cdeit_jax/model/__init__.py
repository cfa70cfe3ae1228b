"""The network: the CDEIT transformer, its attention backends, the diffusion and FLOP counts.

The names of `cdeit_jax.model.network` are also given here on first use (PEP 562), as they were
when this package was one module (`from cdeit_jax.model import CDEIT`)."""

import importlib
import importlib.util


def __getattr__(name: str):
  if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is None:
    try:
      return getattr(importlib.import_module("cdeit_jax.model.network"), name)
    except AttributeError:
      pass
  raise AttributeError(f"module 'cdeit_jax.model' has no attribute {name!r}")
