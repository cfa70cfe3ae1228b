"""The measuring system as a random variable: one draw per example of `SystemSpec`.

A draw (`DrawnSystem`, a pytree) holds what `fem.CEM.voltages` takes as a drawn system
(electrode centres, half-widths and weights 1 / z, 0 for an absent passive electrode) and what
acts on its output (gain, SNR offset), for any measuring system's electrodes (`eit.layout`;
CDEIT's 16 by default): they are turned and moved around the layout's own positions. The tank
radius R and background conductivity s enter through the 2-D scalings
(docs/reference/eit-conventions.md, the voltages do not depend on the radius): the electrode
terms scale with R (edge lengths) and the stiffness with s, so the system (R, s, z) measures the
voltages of (1, 1, z s / R) divided by s: weights R / (s z), gain g / s. Nothing here needs a
new mesh or Jacobian, so a draw costs the same as the fixed system's solve (plus the boundary's
unknowns, `bench/bench_simulate.py`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.eit import layout as layout_lib
from cdeit_jax.eit.fem import nominal_centres
from cdeit_jax.eit.spec import SystemSpec

MIN_GAP = 0.1  # each electrode keeps at most this fraction of the distance to its neighbours free


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DrawnSystem:
  """One measuring system as drawn (or a batch of them, leading axes alike): the electrodes'
  polar angles, half-widths (radians) and weights radius / (background z) (electrodes,), the
  layout's electrodes first, then any passive ones; the gain on the voltages; the SNR's
  offset (dB); the drift, a further factor on the target frame's voltages alone (the
  background's change since the empty tank was measured)."""

  centres: jax.Array
  half_widths: jax.Array
  weights: jax.Array
  gain: jax.Array
  snr_offset_db: jax.Array
  drift: jax.Array


def num_electrodes(spec: SystemSpec, lay: layout_lib.Layout) -> int:
  """Electrodes a drawn system of `spec` has for the layout: its own, and as many passive ones
  in the gaps when `spec.passive` > 0."""
  e = lay.num_electrodes
  return 2 * e if spec.passive > 0 else e


def _log_uniform(key, pair, shape=()):
  lo, hi = (float(v) for v in pair)
  if lo == hi:
    return jnp.full(shape, lo)
  return jnp.exp(jax.random.uniform(key, shape, minval=np.log(lo), maxval=np.log(hi)))


def draw(
  key: jax.Array,
  spec: SystemSpec,
  contact_impedance: float,
  lay: layout_lib.Layout,
) -> DrawnSystem:
  """One system of `spec` from `key` (jit/vmap-able) around the layout's electrodes.
  `contact_impedance`: the nominal value, used when `spec.contact_impedance` is (0, 0)."""
  e = lay.num_electrodes
  ne = num_electrodes(spec, lay)
  ks = jax.random.split(key, 10)
  z_pair = (
    spec.contact_impedance
    if tuple(spec.contact_impedance) != (0.0, 0.0)
    else (contact_impedance, contact_impedance)
  )
  z = _log_uniform(ks[0], z_pair, (ne,))
  u = lambda k, half, shape=(): jax.random.uniform(k, shape, minval=-half, maxval=half)
  centres = (
    jnp.asarray(nominal_centres(lay, ne > e))
    + jnp.deg2rad(u(ks[1], spec.rotation_deg))
    + jnp.deg2rad(u(ks[2], spec.jitter_deg, (ne,)))
  )
  width = jax.random.uniform(ks[3], (), minval=spec.width_deg[0], maxval=spec.width_deg[1])
  width = np.deg2rad(1.0) * width * (1 + u(ks[4], spec.width_jitter, (ne,)))
  present = jnp.concatenate(
    [jnp.ones(e), jnp.full((ne - e,), jax.random.bernoulli(ks[5], spec.passive))]
  )
  # room: the angle to the nearer neighbour among the electrodes present (either direction)
  spacing = lambda c: jnp.abs(jnp.mod(c - jnp.roll(c, -1) + np.pi, 2 * np.pi) - np.pi)
  nearer = lambda c: jnp.minimum(spacing(c), jnp.roll(spacing(c), 1))
  room = nearer(centres[:e])
  if ne > e:  # the ring of all electrodes in order: 0, E, 1, E + 1, ...
    ring = np.stack([np.arange(e), np.arange(e, ne)], 1).ravel()
    all_room = jnp.zeros(ne).at[ring].set(nearer(centres[ring]))
    room = jnp.concatenate([jnp.where(present[-1] > 0, all_room[:e], room), all_room[e:]])
  half = jnp.minimum(width / 2, (1 - MIN_GAP) * room / 2)
  radius = _log_uniform(ks[6], spec.radius)
  background = _log_uniform(ks[7], spec.background)
  gain = _log_uniform(ks[8], spec.gain)
  return DrawnSystem(
    centres=centres,
    half_widths=half,
    weights=present * radius / (background * z),
    gain=gain / background,
    snr_offset_db=u(ks[9], spec.snr_spread_db),
    drift=draw_drift(jax.random.fold_in(key, 10), spec),
  )


def draw_drift(key: jax.Array, spec: SystemSpec) -> jax.Array:
  """The target frame's factor of one example (`SystemSpec.drift`), from its own key so that
  the other draws of a key do not change with it, and so that one device (`device_seed`) still
  drifts per measurement."""
  return _log_uniform(key, spec.drift)
