"""The measuring system as a random variable: one draw per example of `SystemSpec`.

A draw holds what `fem.VariableCEM` needs (electrode centres, half-widths and weights 1 / z, 0 for
an absent passive electrode) and what acts on its output (gain, SNR offset). The tank radius R
and background conductivity s enter through the 2-D scalings (docs/reference/eit-conventions.md, the
voltages do not depend on the radius): the electrode terms scale with R (edge lengths) and the
stiffness with s, so the system (R, s, z) measures the voltages of (1, 1, z s / R) divided by s:
weights R / (s z), gain g / s. Nothing here needs a new mesh or Jacobian, so a draw costs the
same as the fixed system's solve (plus the boundary's unknowns, `bench/bench_simulate.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cdeit_jax.eit.fem import nominal_centres
from cdeit_jax.eit.measurement import NUM_ELECTRODES
from cdeit_jax.eit.spec import SystemSpec

MIN_GAP = 0.1  # each electrode keeps at most this fraction of the distance to its neighbours free


def num_electrodes(spec: SystemSpec) -> int:
  """Electrodes a `VariableCEM` for `spec` models (16, or 32 with passive ones)."""
  return 2 * NUM_ELECTRODES if spec.passive > 0 else NUM_ELECTRODES


def _log_uniform(key, pair, shape=()):
  lo, hi = (float(v) for v in pair)
  if lo == hi:
    return jnp.full(shape, lo)
  return jnp.exp(jax.random.uniform(key, shape, minval=np.log(lo), maxval=np.log(hi)))


def draw(key: jax.Array, spec: SystemSpec, contact_impedance: float) -> dict[str, jax.Array]:
  """One system of `spec` from `key` (jit/vmap-able). `contact_impedance`: the nominal value,
  used when `spec.contact_impedance` is (0, 0)."""
  ne = num_electrodes(spec)
  ks = jax.random.split(key, 10)
  z_pair = (
    spec.contact_impedance
    if tuple(spec.contact_impedance) != (0.0, 0.0)
    else (contact_impedance, contact_impedance)
  )
  z = _log_uniform(ks[0], z_pair, (ne,))
  u = lambda k, half, shape=(): jax.random.uniform(k, shape, minval=-half, maxval=half)
  centres = (
    jnp.asarray(nominal_centres(ne))
    + jnp.deg2rad(u(ks[1], spec.rotation_deg))
    + jnp.deg2rad(u(ks[2], spec.jitter_deg, (ne,)))
  )
  width = jax.random.uniform(ks[3], (), minval=spec.width_deg[0], maxval=spec.width_deg[1])
  width = np.deg2rad(1.0) * width * (1 + u(ks[4], spec.width_jitter, (ne,)))
  present = jnp.concatenate(
    [
      jnp.ones(NUM_ELECTRODES),
      jnp.full((ne - NUM_ELECTRODES,), jax.random.bernoulli(ks[5], spec.passive)),
    ]
  )
  # room: the angle to the nearer neighbour among the electrodes present
  spacing = lambda c: jnp.mod(c - jnp.roll(c, -1), 2 * np.pi)  # to the next one clockwise
  nearer = lambda c: jnp.minimum(spacing(c), jnp.roll(spacing(c), 1))
  room = nearer(centres[:NUM_ELECTRODES])
  if ne > NUM_ELECTRODES:  # the ring of all 32, clockwise: 0, 16, 1, 17, ...
    ring = np.stack([np.arange(NUM_ELECTRODES), np.arange(NUM_ELECTRODES, ne)], 1).ravel()
    all_room = jnp.zeros(ne).at[ring].set(nearer(centres[ring]))
    room = jnp.concatenate(
      [jnp.where(present[-1] > 0, all_room[:NUM_ELECTRODES], room), all_room[NUM_ELECTRODES:]]
    )
  half = jnp.minimum(width / 2, (1 - MIN_GAP) * room / 2)
  radius = _log_uniform(ks[6], spec.radius)
  background = _log_uniform(ks[7], spec.background)
  gain = _log_uniform(ks[8], spec.gain)
  return {
    "centres": centres,
    "half_widths": half,
    "weights": present * radius / (background * z),
    "gain": gain / background,
    "snr_offset_db": u(ks[9], spec.snr_spread_db),
  }


def fixed(spec: SystemSpec, contact_impedance: float, seed: int = 0) -> dict[str, np.ndarray]:
  """One draw as host arrays: a single system (e.g. a foreign test system whose ranges are
  points)."""
  return {k: np.asarray(v) for k, v in draw(jax.random.key(seed), spec, contact_impedance).items()}
