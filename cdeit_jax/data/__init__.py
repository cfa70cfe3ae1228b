"""Training and test data: the npz format, sources, grain pipelines, statistics, the simulated
distribution.

The names of `cdeit_jax.data.sources` (`NpzSource`, `ArraySource`) are also given here on first
use (PEP 562), as they were when this package was one module."""

from cdeit_jax.common import moved_modules

__getattr__ = moved_modules.names_of(__name__, "cdeit_jax.data.sources")
