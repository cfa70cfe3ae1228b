"""A 2-D EIT simulator in JAX (complete electrode model) in the CDEIT conventions.

  from cdeit_jax import eit
  ys = eit.simulate_voltages(xs_images)            # (B, 208) noise-free difference voltages
  ys = eit.simulate_voltages(xs_images, 40.0, jax.random.key(0))
  rec = eit.default_tikhonov(layout.preset("cdeit16"))(ys)  # (B, 128, 128) baseline

Modules: spec (what is simulated: plain dataclasses, no JAX), layout (a device's electrodes,
patterns and values, presets and device files: the one `Layout`), measurement (CDEIT's 208 values
and a device's units), mesh (unit-disk mesh, electrodes), fem (CEM forward model: a fixed system,
or one per example), system (the measuring system drawn per example), phantom (random inclusions
on mesh and grid), simulator (images/phantoms -> voltages, noise), tikhonov (Tikhonov/NOSER and
the Jacobian), conditioning (the physics-informed channels the network reads), calibration (a
device fitted to its empty tank), symmetry (the tank's turns and mirror). The names below load
their module on first use (PEP 562), so that `cdeit_jax.eit.spec` is read without JAX (configs
import it).
"""

import importlib

_WHERE = {
  "CEM": "fem",
  "nominal_centres": "fem",
  "SystemSpec": "spec",
  "DiskMesh": "mesh",
  "MeshSpec": "mesh",
  "electrode_angles": "mesh",
  "make_mesh": "mesh",
  "PhantomSpec": "spec",
  "random_params": "phantom",
  "render_image": "phantom",
  "Tikhonov": "tikhonov",
  "default_tikhonov": "tikhonov",
  "jacobian": "tikhonov",
  "Simulator": "simulator",
  "add_noise": "simulator",
  "default_simulator": "simulator",
  "simulate_voltages": "simulator",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
  if name == "system":
    return importlib.import_module(f"{__name__}.system")
  if name not in _WHERE:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__():
  return sorted(list(globals()) + __all__)
