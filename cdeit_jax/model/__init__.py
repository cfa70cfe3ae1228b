"""The network: the CDEIT transformer, its attention backends, the diffusion and FLOP counts.

The names of `cdeit_jax.model.network` are also given here on first use (PEP 562), as they were
when this package was one module (`from cdeit_jax.model import CDEIT`)."""

from cdeit_jax.common import moved_modules

__getattr__ = moved_modules.names_of(__name__, "cdeit_jax.model.network")
