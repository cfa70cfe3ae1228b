"""A 2-D EIT simulator in JAX (complete electrode model) in the CDEIT conventions.

  from cdeit_jax import eit
  ys = eit.simulate_voltages(xs_images)            # (B, 208) noise-free difference voltages
  ys = eit.simulate_voltages(xs_images, 40.0, jax.random.key(0))
  rec = eit.default_tikhonov()(ys)                  # (B, 128, 128) one-step baseline

Modules: mesh (unit-disk mesh, electrodes), fem (CEM forward model), phantom (random inclusions
on mesh and grid), simulator (images/phantoms -> voltages, noise), reconstruct (Tikhonov/NOSER).
"""

from cdeit_jax.eit.fem import CEM, injection_currents, measurement_pairs
from cdeit_jax.eit.mesh import DiskMesh, MeshSpec, electrode_angles, make_mesh
from cdeit_jax.eit.phantom import PhantomSpec, random_params, render_image
from cdeit_jax.eit.reconstruct import Tikhonov, default_tikhonov, jacobian
from cdeit_jax.eit.simulator import Simulator, add_noise, default_simulator, simulate_voltages

__all__ = ["CEM", "DiskMesh", "MeshSpec", "PhantomSpec", "Simulator", "Tikhonov", "add_noise",
           "default_simulator", "default_tikhonov", "electrode_angles", "injection_currents",
           "jacobian", "make_mesh", "measurement_pairs", "random_params", "render_image",
           "simulate_voltages"]
