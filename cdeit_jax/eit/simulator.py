"""CDEIT-convention simulation: label images or phantoms -> noisy difference voltages.

Units: I = 1 mA, sigma_bg = 1, volts; `ys = v(sigma) - v(sigma_bg)`: CDEIT's 208 values in its
order and sign, or any measuring system's (`eit.layout.Layout`) in its order.
Label images follow the CDEIT convention: sigma = sigma_bg * 10^xs pixel-wise, xs[row, col] at
((col - 63.5) / 64, (row - 63.5) / 64); a triangle's conductivity is the mean over its sample
points of the pixel they fall in (partial volume), so the map from 10^xs to the mesh is linear.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.fem import CEM
from cdeit_jax.eit.layout import Layout
from cdeit_jax.eit.mesh import MeshSpec, make_mesh, spec_for
from cdeit_jax.eit.spec import ROW
from cdeit_jax.eit.system import DrawnSystem


def add_noise(v: jax.Array, snr_db: float, key: jax.Array) -> jax.Array:
  """White Gaussian noise at `snr_db` relative to each vector's power (last axis):
  per-entry std = rms(v) * 10^(-snr_db / 20) (40 dB: 1 % of the rms)."""
  rms = jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True))
  return v + rms * 10.0 ** (-snr_db / 20) * jax.random.normal(key, v.shape, v.dtype)


class Simulator:
  """A CEM forward model plus the maps from label images and phantoms to its elements."""

  def __init__(
    self,
    layout: Layout,
    mesh_spec: MeshSpec | None = None,
    sigma_bg: float = 1.0,
    dtype=jnp.float32,
    samples_per_edge: int = 8,
  ):
    """`layout`: the measuring system (`eit.layout`: electrodes, patterns, contact impedance;
    `layout.preset("cdeit16")`: CDEIT's 208 values), on a mesh made for its electrodes unless
    `mesh_spec` is given."""
    self.mesh = make_mesh(spec_for(layout) if mesh_spec is None else mesh_spec)
    self._cem_args = dict(dtype=dtype, sigma_bg=sigma_bg, layout=layout)
    self.cem = CEM(self.mesh, **self._cem_args)
    self.layout = self.cem.layout
    self.dtype = self.cem.dtype
    self.sigma_bg = float(sigma_bg)
    pts = self.mesh.sample_points(samples_per_edge)  # (E, S, 2)
    self.sample_points = jnp.asarray(pts, self.dtype)
    self.pixel_index = jnp.asarray(ph.pixel_index(pts), jnp.int32)  # (E, S)
    self._vh = None

  @property
  def vh(self) -> jax.Array:
    """Homogeneous voltages (R,)."""
    if self._vh is None:
      with jax.ensure_compile_time_eval():  # computed once, also when first asked under a trace
        self._vh = jax.jit(self.cem.voltages)(
          jnp.full((self.mesh.num_elements,), self.sigma_bg, self.dtype)
        )
    return self._vh

  def image_conductivity(self, xs: jax.Array) -> jax.Array:
    """(..., E) element conductivities of label images (..., 128, 128)."""
    flat = jnp.asarray(xs, self.dtype).reshape(*xs.shape[:-2], -1)
    return self.sigma_bg * jnp.mean(10.0 ** flat[..., self.pixel_index], axis=-1)

  def phantom_conductivity(self, params: jax.Array) -> jax.Array:
    """(..., E) element conductivities of phantoms (..., MAX_INCLUSIONS, ROW)."""
    if params.shape[-1] != ROW:
      raise InputError(
        f"phantom parameters must have {ROW} columns (eit.phantom), got {params.shape}"
      )
    fn = lambda p: ph.element_conductivity(p, self.sample_points, self.sigma_bg)
    p = jnp.asarray(params, self.dtype)
    return jax.vmap(fn)(p.reshape(-1, *p.shape[-2:])).reshape(*p.shape[:-2], -1)

  @functools.lru_cache(maxsize=4)  # noqa: B019 (few long-lived simulators; bounded)
  def support_cem(self, max_radius: float) -> CEM:
    """A CEM that condenses away every element lying outside |p| <= max_radius (those keep
    sigma_bg): phantoms inside that radius solve a ~2-10x smaller system."""
    r = np.hypot(*np.moveaxis(np.asarray(self.sample_points, np.float64), -1, 0)).min(-1)
    with jax.ensure_compile_time_eval():  # constants, also when first built under a trace
      return CEM(self.mesh, support=r <= max_radius, **self._cem_args)

  def difference(
    self,
    sigma: jax.Array,
    snr_db: float | None = None,
    key: jax.Array | None = None,
    cem: CEM | None = None,
  ) -> jax.Array:
    """ys (..., R) for element conductivities (..., E); with snr_db, noise on both vectors
    from `key` (one key, or one per example for batch-independent noise)."""
    vi = (cem or self.cem).voltages(sigma)
    vh = jnp.broadcast_to(self.vh, vi.shape)
    if snr_db is None:
      return vi - vh
    if key is None:
      raise InputError("snr_db needs a PRNG key (key=jax.random.key(seed))")
    if key.shape == ():
      ki, kh = jax.random.split(key)
      return add_noise(vi, snr_db, ki) - add_noise(vh, snr_db, kh)
    if key.shape != vi.shape[:-1]:
      raise InputError(f"key must be one key or one per example {vi.shape[:-1]}, got {key.shape}")
    # one key per example: its noise does not depend on which batch it is computed in
    noisy = lambda a, b, k: (
      add_noise(a, snr_db, jax.random.fold_in(k, 0))
      - add_noise(b, snr_db, jax.random.fold_in(k, 1))
    )
    flat = lambda a: a.reshape(-1, a.shape[-1])
    return jax.vmap(noisy)(flat(vi), flat(vh), key.reshape(-1)).reshape(vi.shape)

  def drawn_cem(self, passive: bool, max_radius: float = 1.0) -> CEM:
    """The CEM that solves systems drawn per example (`system_difference`), its operators for
    `passive` made now (outside any trace); with max_radius < 1 the elements outside
    |p| <= max_radius are condensed away as in `support_cem`."""
    cem = self.support_cem(max_radius) if max_radius < 1 else self.cem
    with jax.ensure_compile_time_eval():
      cem.drawn(passive)
    return cem

  def system_difference(
    self,
    sigma: jax.Array,
    systems: DrawnSystem,
    snr_db: float | None = None,
    keys: jax.Array | None = None,
    max_radius: float = 1.0,
  ) -> jax.Array:
    """ys (B, R) for element conductivities (B, E), each example measured by its own system
    (`eit.system.draw`, leading axis B): the gain on both vectors and the drift on the target's,
    then (with snr_db) noise at snr_db + the system's offset on each, from the example's key
    (one per example)."""
    passive = systems.centres.shape[-1] > self.cem.num_electrodes
    cem = self.drawn_cem(bool(passive), float(max_radius))
    homogeneous = jnp.full((self.mesh.num_elements,), self.sigma_bg, self.dtype)
    if snr_db is not None and keys is None:
      raise InputError("snr_db needs one PRNG key per example")

    def one(s, system, key):
      vi = cem.voltages(s, system) * (system.gain * system.drift)
      vh = cem.voltages(homogeneous, system) * system.gain
      if snr_db is None:
        return vi - vh
      snr = snr_db + system.snr_offset_db
      return add_noise(vi, snr, jax.random.fold_in(key, 0)) - add_noise(
        vh, snr, jax.random.fold_in(key, 1)
      )

    if keys is None:
      keys = jnp.zeros(sigma.shape[:1], jnp.uint32)
    return jax.vmap(one)(jnp.asarray(sigma, self.dtype), systems, keys)

  @functools.partial(jax.jit, static_argnames=("self", "snr_db"))
  def image_voltages(
    self, xs: jax.Array, snr_db: float | None = None, key: jax.Array | None = None
  ) -> jax.Array:
    """ys (..., R) of label images (..., 128, 128), sigma = sigma_bg * 10^xs pixel-wise."""
    return self.difference(self.image_conductivity(xs), snr_db, key)

  @functools.partial(jax.jit, static_argnames=("self", "snr_db", "max_radius"))
  def phantom_voltages(
    self,
    params: jax.Array,
    snr_db: float | None = None,
    key: jax.Array | None = None,
    max_radius: float = 1.0,
  ) -> jax.Array:
    """ys (..., R) of phantoms (..., MAX_INCLUSIONS, ROW) lying inside |p| <= max_radius."""
    cem = self.support_cem(max_radius) if max_radius < 1 else self.cem
    return self.difference(self.phantom_conductivity(params), snr_db, key, cem)


def default_simulator(layout: Layout, dtype: str = "float32") -> Simulator:
  """One shared instance per measuring system and dtype: its jitted functions compile once per
  process. Systems that measure alike (`Layout.physics`: a device and its units) share one."""
  return _shared(str(jnp.dtype(dtype)), layout.physics)


@functools.lru_cache(maxsize=4)
def _shared(dtype: str, physics: Layout) -> Simulator:
  cdeit16 = layout_lib.preset("cdeit16")
  return Simulator(cdeit16 if physics == cdeit16.physics else physics, dtype=dtype)


def simulate_voltages(
  xs_images, snr_db: float | None = None, key: jax.Array | None = None, dtype: str = "float32"
) -> jax.Array:
  """Difference voltages (B, 208) of label images (B, 128, 128) (sigma = 10^xs pixel-wise,
  I = 1 mA, sigma_bg = 1, 4-degree electrodes, contact impedance `CONTACT_IMPEDANCE`); noise-free
  when snr_db is None, else white noise at snr_db on the homogeneous and the inhomogeneous vectors
  independently."""
  xs = jnp.asarray(xs_images)
  if xs.ndim != 3 or xs.shape[1:] != (ph.IMAGE_SIZE, ph.IMAGE_SIZE):
    raise InputError(f"xs_images must be (B, {ph.IMAGE_SIZE}, {ph.IMAGE_SIZE}), got {xs.shape}")
  return default_simulator(layout_lib.preset("cdeit16"), dtype).image_voltages(xs, snr_db, key)
