"""CDEIT (conditional diffusion for EIT image reconstruction) in JAX/Flax NNX.

`cdeit_jax.Reconstructor` is the inference API (`cdeit_jax.infer.reconstructor`); it loads on
first use (PEP 562), so that configs and the measurement conventions are read without JAX. The
package's layers are in docs/architecture.md.
"""


def __getattr__(name: str):
  if name in ("Reconstructor", "Reconstruction"):
    from cdeit_jax.infer import reconstructor

    return getattr(reconstructor, name)
  raise AttributeError(f"module 'cdeit_jax' has no attribute {name!r}")
