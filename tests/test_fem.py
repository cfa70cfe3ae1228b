"""The complete electrode model (`eit.fem`, `eit.system`): against EIDORS, analytic solutions,
finite differences and autodiff; any electrodes, passive ones, background and radius; drawn
systems."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, disc_params, rel_l2

from cdeit_jax import eit
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit import measurement, tikhonov
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values


def test_patterns_by_hand():
  """CDEIT's system and two other rules' patterns, written out by hand (EIDORS's convention:
  pairs touching a current-carrying electrode are not measured)."""
  first = lambda lay, p: list(lay.rows[lay.rows[:, 0] == p, 1])
  c = lay.preset("cdeit16")
  assert c.num_values == 208 and measurement.stats_shape(c) == (1, 16, 13)
  assert first(c, 0) == list(range(2, 15))  # injection 0 skips 15, 0, 1
  assert first(c, 5) == [0, 1, 2, 3] + list(range(7, 16))
  cur = c.currents * measurement.CURRENT
  assert cur[3, 3] == -1e-3 and cur[4, 3] == 1e-3 and cur[0, 15] == 1e-3 and cur.sum() == 0
  # skip 1 ("opposite-ish"): injection 0 drives 0 -> 2; pairs (m, m+2) touching 0 or 2 are
  # m = 0, 2 and 14 (14, 0)
  skip = lay.from_rules(16, injection="skip-1", measurement="skip-1")
  assert first(skip, 0) == [1] + list(range(3, 14)) + [15]
  assert list(skip.rows[:2, 2]) == [3, 5] and skip.currents[2, 0] == 1.0
  wide = lay.from_rules(32)
  assert wide.num_values == 32 * 29 and first(wide, 31) == list(range(1, 30))
  with pytest.raises(ValueError, match="skip-20"):
    lay.from_rules(16, measurement="skip-20")


def test_homogeneous_matches_eidors(sim64):
  eidors = np.load(FIXTURES / "eidors_j2d3c_vh_I1mA.npy").ravel()
  with jax.enable_x64(True):
    vh = np.asarray(sim64.vh)
  assert np.all(vh > 0)
  assert np.max(np.abs(vh / eidors - 1)) < 0.01
  assert abs(vh[0] / 9.551375e-5 - 1) < 0.01


def test_large_contact_impedance_tends_to_gap_model():
  gap = np.load(FIXTURES / "analytic_gap4deg_vh.npy").ravel()
  with jax.enable_x64(True):
    err = {}
    for z in (0.01, 100.0):
      device = lay.preset("cdeit16").with_contact_impedance(z)
      sim = eit.Simulator(dtype="float64", layout=device)
      err[z] = np.max(np.abs(np.asarray(sim.vh) / gap - 1))
  assert err[100.0] < 0.01
  assert err[100.0] < err[0.01]


def test_eidors_disc(sim64):
  ref = np.load(FIXTURES / "eidors_j2d3c_dv_circ.npy").ravel()
  with jax.enable_x64(True):
    # additive C = +0.3 with partial volume == label log10(1.3) averaged as 10^label
    dv = np.asarray(sim64.phantom_voltages(disc_params(0.4, 0.4, 0.2, 1.3)))
  assert np.corrcoef(dv, ref)[0, 1] >= 0.999
  assert rel_l2(dv, ref) <= 0.03


def test_concentric_disc_analytic(sim64):
  ref = np.load(FIXTURES / "analytic_gap4deg_concentric_r0.3_s2_dv.npy").ravel()
  with jax.enable_x64(True):
    dv = np.asarray(sim64.phantom_voltages(disc_params(0.0, 0.0, 0.3, 2.0)))
  assert rel_l2(dv, ref) <= 0.03


def test_condensed_system_equals_full(sim64):
  params = np.stack([disc_params(0.4, -0.3, 0.25, 5.0), disc_params(-0.7, 0.2, 0.2, 0.2)])
  with jax.enable_x64(True):
    full = np.asarray(sim64.phantom_voltages(params))
    cond = np.asarray(sim64.phantom_voltages(params, max_radius=0.95))
    assert sim64.support_cem(0.95).num_unknowns < sim64.cem.num_unknowns
  assert np.max(np.abs(cond - full)) < 1e-9 * np.max(np.abs(full))


def test_float32_close_to_float64(sim64):
  params = disc_params(0.3, 0.5, 0.25, 10.0)
  with jax.enable_x64(True):
    d64 = np.asarray(sim64.phantom_voltages(params))
  d32 = np.asarray(eit.default_simulator(CDEIT16).phantom_voltages(params))
  assert d32.dtype == np.float32
  assert rel_l2(d32, d64) < 3e-3


def test_jacobian_matches_finite_differences(sim64):
  """Autodiff through the CEM (custom_linear_solve) against central differences in float64."""
  rng = np.random.default_rng(0)
  d = rng.standard_normal((ph.IMAGE_SIZE, ph.IMAGE_SIZE))
  with jax.enable_x64(True):
    f = jax.jit(lambda x: sim64.difference(sim64.image_conductivity(x)))
    x0 = jnp.asarray(0.1 * rng.standard_normal(d.shape))
    _, jd = jax.jvp(f, (x0,), (jnp.asarray(d),))
    eps = 1e-4
    fd = (f(x0 + eps * d) - f(x0 - eps * d)) / (2 * eps)
    g = jax.grad(lambda x: f(x)[17])(x0)
  assert rel_l2(jd, fd) < 1e-6
  assert np.isclose(float(jnp.vdot(g, d)), float(jd[17]), rtol=1e-8)


def test_adjoint_jacobian_is_autodiffs(sim64):
  """The adjoint Jacobian (`tikhonov.jacobian`) equals autodiff through the CEM in float64: its
  product with a random image direction against the forward-mode derivative (every row), for
  CDEIT's system and a 16-electrode skip-2 device measuring on its current-carrying electrodes
  (counter-clockwise, another contact impedance); a float32 simulator gets it in float32."""
  from cdeit_jax.eit import layout as lay
  from cdeit_jax.eit import simulator

  d = np.random.default_rng(1).standard_normal((ph.IMAGE_SIZE, ph.IMAGE_SIZE))
  device = lay.from_rules(16, injection="skip-2", measure_injecting=True, clockwise=False)
  device = device.with_contact_impedance(0.05)
  with jax.enable_x64(True):
    sims = [sim64, simulator.Simulator(layout=device, dtype="float64")]
    for sim in sims:
      jac = tikhonov.jacobian(sim)
      f = jax.jit(lambda x, sim=sim: sim.difference(sim.image_conductivity(x)))
      _, jd = jax.jvp(f, (jnp.zeros(d.shape),), (jnp.asarray(d),))
      assert jac.dtype == np.float64 and jac.shape[0] == len(jd)
      assert rel_l2(jac.reshape(len(jac), -1) @ d.reshape(-1), jd) < 1e-9
  assert tikhonov.jacobian(eit.default_simulator(CDEIT16)).dtype == np.float32


# --- the measuring system drawn per example (eit.system, fem.CEM with a drawn system) ---


def gap_model(centres, half_widths, terms=4000):
  """The gap model's 208 voltages (sigma = 1, I = 1 mA) for electrodes anywhere: uniform current
  density on electrode j, potential averaged over electrode l (docs/reference/eit-conventions.md,
  generalised to one angle and half-width per electrode): U_l = sum_j I_j / pi sum_n sinc(n a_l)
  sinc(n a_j)
  cos(n (t_l - t_j)) / n."""
  n = np.arange(1, terms + 1)[:, None, None]
  sinc = lambda a: np.sin(n * a) / (n * a)
  kernel = (
    sinc(half_widths[None, :, None])
    * sinc(half_widths[None, None, :])
    / (np.pi * n)
    * np.cos(n * (centres[:, None] - centres[None, :])[None])
  ).sum(0)
  p, plus, minus = lay.preset("cdeit16").rows.T
  u = kernel @ (lay.preset("cdeit16").currents * 1e-3)  # (electrodes, injections)
  return u[plus, p] - u[minus, p]


CENTRES = eit.nominal_centres(lay.preset("cdeit16"))
CENTRES32 = eit.nominal_centres(lay.preset("cdeit16"), passive=True)


def system_of(centres, half_widths, z):
  return eit.system.DrawnSystem(
    centres=np.asarray(centres),
    half_widths=np.asarray(half_widths),
    weights=1 / np.asarray(z, np.float64) * np.ones(len(centres)),
    gain=np.float64(1.0),
    snr_offset_db=np.float64(0.0),
    drift=np.float64(1.0),
  )


def test_variable_cem_with_the_nominal_system_is_the_fixed_cem(sim64):
  rng = np.random.default_rng(0)
  sigma = np.exp(0.3 * rng.standard_normal(sim64.mesh.num_elements))
  half = np.full(16, np.deg2rad(2.0))
  with jax.enable_x64(True):
    fixed = np.asarray(sim64.cem.voltages(sigma))
    var = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    got = np.asarray(var.voltages(sigma, system_of(CENTRES, half, 0.01)))
    # 32 slots whose passive electrodes are absent (weight 0): the same 16-electrode system
    var32 = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    sys32 = system_of(CENTRES32, np.full(32, np.deg2rad(2.0)), 0.01)
    sys32.weights[16:] = 0
    got32 = np.asarray(var32.voltages(sigma, sys32))
  assert np.max(np.abs(got - fixed)) < 1e-10 * np.max(np.abs(fixed))
  assert np.max(np.abs(got32 - fixed)) < 1e-10 * np.max(np.abs(fixed))


def test_electrodes_anywhere_match_the_gap_model(sim64):
  """Electrodes turned, moved and resized off the mesh's nodes (partly covered boundary edges):
  with a large contact impedance the CEM tends to the analytic gap model (0.25 % at the nominal
  electrodes, test_gap_model...)."""
  rng = np.random.default_rng(1)
  centres = CENTRES + np.deg2rad(3.0 + rng.uniform(-2, 2, 16))
  half = np.deg2rad(rng.uniform(3, 10, 16)) / 2
  with jax.enable_x64(True):
    var = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    v = np.asarray(var.voltages(np.ones(sim64.mesh.num_elements), system_of(centres, half, 100.0)))
  ref = gap_model(centres, half)
  assert np.max(np.abs(v / ref - 1)) < 0.005
  # and it is not the nominal layout's answer
  assert np.max(np.abs(gap_model(CENTRES, np.full(16, half.mean())) / ref - 1)) > 0.05


def test_passive_electrodes_shunt_and_keep_reciprocity(sim64):
  """Floating electrodes in the gaps carry current past the measuring pairs (adjacent voltages
  drop) and the transfer impedances stay symmetric (reciprocity: the voltage between (a, b)
  driving (c, d) equals the voltage between (c, d) driving (a, b))."""
  rng = np.random.default_rng(2)
  sigma = np.exp(0.5 * rng.standard_normal(sim64.mesh.num_elements))
  with jax.enable_x64(True):
    var32 = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    present = system_of(CENTRES32, np.full(32, np.deg2rad(4.0)), 0.01)
    absent = dataclasses.replace(
      present, weights=np.where(np.arange(32) < 16, present.weights, 0.0)
    )
    with_p = np.asarray(var32.voltages(sigma, present)).reshape(16, 13)
    without = np.asarray(var32.voltages(np.ones_like(sigma), absent)).reshape(16, 13)
    with_h = np.asarray(var32.voltages(np.ones_like(sigma), present)).reshape(16, 13)
  assert np.all(with_h < without)  # every homogeneous voltage drops
  pairs = lay.preset("cdeit16").rows[:, 1].reshape(16, 13)
  for k in range(16):
    for j, m in enumerate(pairs[k]):
      jj = list(pairs[m]).index(k)  # drive (m, m+1), measure (k, k+1)
      assert with_p[k, j] == pytest.approx(with_p[m, jj], rel=1e-8)


def test_background_and_radius_are_contact_impedance_and_gain(sim64):
  """The 2-D scalings that `eit.system.draw` relies on: a tank whose every conductivity is s
  times larger measures 1/s times the voltages of the unit tank with contact impedance z s."""
  rng = np.random.default_rng(3)
  sigma = np.exp(0.3 * rng.standard_normal(sim64.mesh.num_elements))
  half = np.full(16, np.deg2rad(5.0))
  s, z = 2.5, 0.02
  with jax.enable_x64(True):
    scaled = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16, sigma_bg=s)
    unit = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    a = np.asarray(scaled.voltages(s * sigma, system_of(CENTRES, half, z)))
    b = np.asarray(unit.voltages(sigma, system_of(CENTRES, half, z * s))) / s
  np.testing.assert_allclose(a, b, rtol=1e-9)


def test_system_draws_stay_in_their_ranges_and_apart():
  spec = eit.SystemSpec()
  draws = jax.jit(jax.vmap(lambda k: eit.system.draw(k, spec, 0.01, CDEIT16)))(
    jax.random.split(jax.random.key(0), 500)
  )
  d = {k: np.asarray(v, np.float64) for k, v in dataclasses.asdict(draws).items()}
  assert d["centres"].shape == (500, 32)
  start, end = d["centres"] - d["half_widths"], d["centres"] + d["half_widths"]
  present = d["weights"] > 0
  assert 0.2 < present[:, 16:].mean() < 0.4  # passive: probability 0.3
  for i in range(500):
    on = np.flatnonzero(present[i])
    order = on[np.argsort(-np.mod(d["centres"][i, on] - np.pi / 2, 2 * np.pi))]
    gaps = np.mod(start[i, order] - np.roll(end[i, order], -1), 2 * np.pi)
    assert np.all(gaps > 0) and np.all(gaps < np.pi)  # clockwise, never touching
  width = np.rad2deg(2 * d["half_widths"])
  assert width.max() <= 12 * 1.15 + 1e-9 and width.min() >= 3 * 0.85 - 1e-9
  move = np.rad2deg(d["centres"][:, :16] - CENTRES[None])
  assert np.abs(move).max() <= 4.0 + 1.5 + 1e-6 and np.abs(move).std() > 1.0
  assert np.all(np.abs(d["snr_offset_db"]) <= 10)
  gain_lo, gain_hi = 0.8 / 1.4, 1.4 / 0.7  # gain / background
  assert gain_lo - 1e-6 <= d["gain"].min() and d["gain"].max() <= gain_hi + 1e-6
  z = 1 / d["weights"][present]  # z background / radius
  assert z.min() >= 0.003 * 0.7 / 1.1 - 1e-9 and z.max() <= 0.1 * 1.4 / 0.9 + 1e-9
  np.testing.assert_array_equal(d["drift"], 1.0)  # the default: no drift
