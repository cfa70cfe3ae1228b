"""The EIT simulator against EIDORS, analytic solutions and the real UEF2017 tank data."""

import dataclasses
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES

from cdeit_jax import eit
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit import measurement, tikhonov
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rel_l2(a, b):
  return float(np.linalg.norm(np.ravel(a) - np.ravel(b)) / np.linalg.norm(np.ravel(b)))


def disc(cx, cy, r, sigma):
  p = np.zeros((ph.MAX_INCLUSIONS, ph.ROW))
  p[0] = [1, 0, cx, cy, r, 0, 0, np.log10(sigma), 0]
  return p


@pytest.fixture(scope="module")
def sim64():
  with jax.enable_x64(True):
    yield eit.Simulator(CDEIT16, dtype="float64")


def test_mesh_electrodes_and_area():
  m = eit.make_mesh()
  assert np.all(m.areas() > 0)
  assert abs(m.areas().sum() - np.pi) / np.pi < 2e-3  # inscribed polygon of the unit circle
  ends = eit.electrode_angles(4.0)
  for l, edges in enumerate(m.electrode_edges):
    ang = np.unwrap(np.arctan2(m.nodes[edges][..., 1], m.nodes[edges][..., 0]).ravel())
    centre = np.pi / 2 - 2 * np.pi * l / 16  # electrode 0 on top, clockwise
    assert np.isclose(np.angle(np.exp(1j * (ang.mean() - centre))), 0, atol=1e-9)
    assert np.isclose(ang.max() - ang.min(), np.deg2rad(4.0), atol=1e-9)
    assert np.allclose(np.abs(m.nodes[edges]).sum(-1) > 0, True)
  assert np.allclose(ends[:, 1] - ends[:, 0], np.deg2rad(4.0))


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
    dv = np.asarray(sim64.phantom_voltages(disc(0.4, 0.4, 0.2, 1.3)))
  assert np.corrcoef(dv, ref)[0, 1] >= 0.999
  assert rel_l2(dv, ref) <= 0.03


def test_concentric_disc_analytic(sim64):
  ref = np.load(FIXTURES / "analytic_gap4deg_concentric_r0.3_s2_dv.npy").ravel()
  with jax.enable_x64(True):
    dv = np.asarray(sim64.phantom_voltages(disc(0.0, 0.0, 0.3, 2.0)))
  assert rel_l2(dv, ref) <= 0.03


def test_condensed_system_equals_full(sim64):
  params = np.stack([disc(0.4, -0.3, 0.25, 5.0), disc(-0.7, 0.2, 0.2, 0.2)])
  with jax.enable_x64(True):
    full = np.asarray(sim64.phantom_voltages(params))
    cond = np.asarray(sim64.phantom_voltages(params, max_radius=0.95))
    assert sim64.support_cem(0.95).num_unknowns < sim64.cem.num_unknowns
  assert np.max(np.abs(cond - full)) < 1e-9 * np.max(np.abs(full))


def test_float32_close_to_float64(sim64):
  params = disc(0.3, 0.5, 0.25, 10.0)
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


def test_images_drive_the_same_model_as_phantoms(sim64):
  """simulate from the rendered label image == from the phantom (up to pixelisation)."""
  params = disc(-0.3, 0.4, 0.3, 10.0)
  with jax.enable_x64(True):
    from_phantom = np.asarray(sim64.phantom_voltages(params))
    img = ph.render_image(jnp.asarray(params), supersample=1)
    from_image = np.asarray(sim64.image_voltages(img[None]))[0]
  assert np.corrcoef(from_image, from_phantom)[0, 1] > 0.999
  assert rel_l2(from_image, from_phantom) < 0.05


def test_render_orientation_and_area():
  img = np.asarray(ph.render_image(jnp.asarray(disc(0.5, 0.0, 0.3, 10.0), jnp.float32)))
  assert abs(img.sum() * (2 / 128) ** 2 - np.pi * 0.09) / (np.pi * 0.09) < 5e-3
  rows, cols = np.nonzero(img)
  assert cols.min() > 64 and abs(rows.mean() - 63.5) < 0.5  # +x is the column axis
  up = np.asarray(ph.render_image(jnp.asarray(disc(0.0, 0.5, 0.2, 10.0), jnp.float32)))
  assert np.nonzero(up)[0].min() > 64  # +y is increasing rows
  assert img.max() == pytest.approx(1.0) and img[0, 0] == 0


def test_random_phantoms_inside_and_disjoint():
  spec = eit.PhantomSpec()
  rng = np.random.default_rng(0)
  for _ in range(200):
    p = eit.random_params(rng, spec)
    act = p[p[:, 0] > 0]
    assert 1 <= len(act) <= spec.max_inclusions
    assert np.all(np.hypot(act[:, 2], act[:, 3]) + act[:, 4] <= spec.max_radius + 1e-12)
    assert np.all((np.abs(act[:, 7]) >= spec.v_min) & (np.abs(act[:, 7]) <= spec.v_max))
    for i in range(len(act)):
      for j in range(i):
        assert np.hypot(*(act[i, 2:4] - act[j, 2:4])) >= act[i, 4] + act[j, 4]


def test_jax_phantoms_inside_disjoint_and_distributed_as_numpys():
  """draw_params (the simulator's, on the devices) keeps the constraints and draws the
  distribution of the sequential numpy reference random_params."""
  spec = eit.PhantomSpec()
  keys = jax.random.split(jax.random.key(0), 3000)
  p = np.asarray(jax.jit(jax.vmap(lambda k: ph.draw_params(k, spec)))(keys))
  q = np.stack([eit.random_params(np.random.default_rng(i), spec) for i in range(3000)])
  for x in p:
    act = x[x[:, 0] > 0]
    assert 1 <= len(act) <= spec.max_inclusions and np.all(x[len(act) :] == 0)  # active first
    assert np.all(np.hypot(act[:, 2], act[:, 3]) + act[:, 4] <= spec.max_radius + 1e-6)
    assert np.all((np.abs(act[:, 7]) >= spec.v_min) & (np.abs(act[:, 7]) <= spec.v_max))
    for i in range(len(act)):
      for j in range(i):
        assert np.hypot(*(act[i, 2:4] - act[j, 2:4])) >= act[i, 4] + act[j, 4] + 0.03 - 1e-6
  act = lambda x: x[x[..., 0] > 0]
  summary = lambda x: (
    np.bincount((x[..., 0] > 0).sum(1), minlength=7)[1:] / len(x),
    np.bincount(act(x)[:, 1].astype(int), minlength=7) / len(act(x)),
    act(x)[:, 4].mean(),
    np.mean(act(x)[:, 5]),
    np.mean(act(x)[:, 8]),
    np.mean(np.hypot(act(x)[:, 2], act(x)[:, 3]) + act(x)[:, 4] > spec.max_radius - 1e-4),
  )
  for a, b in zip(summary(p), summary(q)):  # 3,000 draws: sampling error ~0.01
    np.testing.assert_allclose(a, b, atol=0.035, rtol=0.03)


def test_resistive_objects_draw_their_own_contrast_range():
  """`PhantomSpec.resistive_v_min/max`: resistive labels in their own range, conductive ones in
  [v_min, v_max], both signs about equally often, alike in draw_params and random_params; the
  defaults (0, 0) keep one range; a range that is not one is refused."""
  spec = eit.PhantomSpec(v_min=0.75, v_max=2.0, resistive_v_min=1.5, resistive_v_max=3.0)
  keys = jax.random.split(jax.random.key(2), 600)
  p = np.asarray(jax.jit(jax.vmap(lambda k: ph.draw_params(k, spec)))(keys))
  q = np.stack([eit.random_params(np.random.default_rng(i), spec) for i in range(600)])
  for x in (p, q):
    v = x[x[..., 0] > 0][:, 7]
    res, con = -v[v < 0], v[v > 0]
    assert 0.4 < len(res) / len(v) < 0.6
    assert res.min() >= 1.5 - 1e-6 and res.max() <= 3.0 + 1e-6 and res.std() > 0.35
    assert con.min() >= 0.75 - 1e-6 and con.max() <= 2.0 + 1e-6 and con.std() > 0.3
    assert res.mean() == pytest.approx(2.25, abs=0.08) and con.mean() == pytest.approx(
      1.375, abs=0.08
    )
  assert eit.PhantomSpec().resistive_range() == (0.5, 1.0)
  for bad in ((2.0, 1.0), (1.0, 0.0)):
    with pytest.raises(InputError, match="resistive_v_min"):
      eit.PhantomSpec(resistive_v_min=bad[0], resistive_v_max=bad[1]).validate()


def test_noise_is_40db_on_each_vector():
  sim = eit.default_simulator(CDEIT16)
  params = np.repeat(disc(0.2, 0.2, 0.3, 10.0)[None], 64, 0)
  clean = np.asarray(sim.phantom_voltages(params[:1], max_radius=0.95))[0]
  keys = jax.random.split(jax.random.key(0), 64)
  noisy = np.asarray(sim.phantom_voltages(params, 40.0, keys, max_radius=0.95))
  vh = np.asarray(sim.vh)
  vi = vh + clean
  rms = lambda v: np.sqrt(np.mean(v * v))
  expected = np.sqrt((0.01 * rms(vi)) ** 2 + (0.01 * rms(vh)) ** 2)  # independent on vi and vh
  assert np.std(noisy - clean) == pytest.approx(expected, rel=0.03)
  assert abs(np.mean(noisy - clean)) < 0.05 * expected


def test_uef2017_labels_explain_the_measurements():
  files = sorted(glob.glob(os.path.join(REPO, "data", "uef2017", "*.npz")))
  assert len(files) == 22
  xs = np.stack([np.load(f)["xs"] for f in files])
  ys = np.stack([np.load(f)["ys"][:, 0] for f in files]) / 1040.856
  dv = np.asarray(eit.simulate_voltages(xs))
  r = [np.corrcoef(a, b)[0, 1] for a, b in zip(dv, ys)]
  assert np.median(r) >= 0.9
  # and the units: a least-squares scale between simulation and the scaled tank data near 1
  assert 0.7 < np.median([(a @ b) / (a @ a) for a, b in zip(dv, ys)]) < 1.4


def test_turned_and_mirrored_tanks_permute_the_voltages():
  """The simulator is the truth: for each of the square's 8 symmetries, the voltages of the turned
  or mirrored image are the original's permuted by `symmetry.permutation` (up to the mesh's
  discretisation, which is not symmetric), and every other element of the group is far off."""
  from cdeit_jax.eit import symmetry

  c = (np.arange(128) - 63.5) / 64
  x, y = np.meshgrid(c, c)
  xs = np.zeros((128, 128), np.float32)  # no symmetry of its own: three unequal inclusions
  xs[(x - 0.35) ** 2 + (y - 0.5) ** 2 < 0.04] = 1.0
  xs[(x + 0.5) ** 2 + (y + 0.1) ** 2 < 0.02] = -1.0
  xs[(x - 0.1) ** 2 + (y + 0.6) ** 2 < 0.01] = 0.7
  dv = np.asarray(eit.simulate_voltages(np.stack([symmetry.image(xs, *g) for g in symmetry.GROUP])))
  for i, g in enumerate(symmetry.GROUP):
    errors = {h: rel_l2(dv[0][symmetry.permutation(*h, CDEIT16)], dv[i]) for h in symmetry.GROUP}
    assert errors[g] < 0.03, (g, errors)
    assert min(e for h, e in errors.items() if h != g) > 0.5, (g, errors)
  # by hand: a quarter turn moves injection k, pair m to k + 4, m + 4; injection 0's pair 2 is
  # measurement 0, injection 4's pair 6 is measurement 4 * 13 + 4 (pairs 0, 1, 2, 6: index 3)
  assert symmetry.permutation(1, False, CDEIT16)[4 * 13 + 3] == 0
  # the mirror (e -> -e) sends injection 0 (0 -> 1) to 15 (15 -> 0) reversed, pair (2, 3) to
  # (13, 14): injection 15 measures pairs 1..13, so pair 13 is its index 12
  assert symmetry.permutation(0, True, CDEIT16)[15 * 13 + 12] == 0
  identity = np.arange(208)
  np.testing.assert_array_equal(
    symmetry.permutation(0, True, CDEIT16)[symmetry.permutation(0, True, CDEIT16)], identity
  )
  assert sorted(symmetry.permutation(3, True, CDEIT16)) == list(identity)
  np.testing.assert_array_equal(symmetry.image(symmetry.image(xs, 1, False), 3, False), xs)


def test_another_devices_turns_and_mirror_are_the_simulators():
  """`symmetry.turn` of other devices, found from their geometry, against the simulator: a
  32-electrode skip-3 device numbered counter-clockwise from 84.375 degrees that measures on its
  current-carrying electrodes (turns and mirror, signs +1), and a 16-electrode device driving
  against electrode 0 (the mirror through electrode 0 keeps the currents' direction but
  reverses each pair: every value negated); that device has no quarter turn (refused, naming
  what to switch off)."""
  from cdeit_jax.eit import simulator, symmetry

  c = (np.arange(128) - 63.5) / 64
  x, y = np.meshgrid(c, c)
  xs = np.zeros((128, 128), np.float32)
  xs[(x - 0.35) ** 2 + (y - 0.5) ** 2 < 0.04] = 1.0
  xs[(x + 0.5) ** 2 + (y + 0.1) ** 2 < 0.02] = -1.0
  ring = lay.from_rules(32, "skip-3", measure_injecting=True, first_deg=84.375, clockwise=False)
  against = lay.from_rules(16, "against-0", measure_injecting=True)
  for device, group in ((ring, [(1, False), (0, True), (3, True)]), (against, [(0, True)])):
    sim = simulator.Simulator(layout=device)
    dv = np.asarray(sim.image_voltages(np.stack([xs] + [symmetry.image(xs, *g) for g in group])))
    for i, g in enumerate(group, 1):
      index, sign = symmetry.turn(*g, device)
      assert rel_l2(dv[0][index] * sign, dv[i]) < 0.03, (device.name, g)
      assert rel_l2(dv[0], dv[i]) > 0.3  # and the turned tank measures something else
  assert np.all(symmetry.turn(0, True, against)[1] == -1)
  assert np.all(symmetry.turn(1, False, ring)[1] == 1)
  with pytest.raises(ValueError, match="not symmetries of this device.*augment=False"):
    symmetry.turn(1, False, against)


def test_a_value_reading_models_conditions_turn_with_their_tank():
  """`symmetry.turn_values`: standardised values (B, R) of a 16-electrode skip-2 device that
  measures on its current-carrying electrodes, turned by each element of the group, equal the
  values turned by `symmetry.turn` (permuted, signed) and standardised again, NaN moving with its
  value; `symmetric` is True for it and False for a device driving against electrode 0."""
  from cdeit_jax.eit import symmetry

  device = lay.from_rules(16, "skip-2", measure_injecting=True)
  rng = np.random.default_rng(0)
  r = device.num_values
  mean, std = rng.normal(size=r).astype(np.float32), rng.uniform(0.5, 2, r).astype(np.float32)
  values = rng.normal(size=(8, r)).astype(np.float32)
  values[3, 5] = np.nan
  cond = (values - mean) / std
  got = np.asarray(symmetry.turn_values(cond, np.arange(8), mean, std, device))
  for k, (q, m) in enumerate(symmetry.GROUP):
    index, sign = symmetry.turn(q, m, device)
    want = (values[k][index] * sign - mean) / std
    np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-5, equal_nan=True)
  assert np.isnan(got[3]).sum() == 1
  assert symmetry.symmetric(device)
  assert not symmetry.symmetric(lay.from_rules(16, "against-0", measure_injecting=True))


def test_simulate_voltages_checks_shape():
  with pytest.raises(ValueError, match="xs_images must be"):
    eit.simulate_voltages(np.zeros((128, 128)))
  with pytest.raises(ValueError, match="PRNG key"):
    eit.simulate_voltages(np.zeros((1, 128, 128)), snr_db=40.0)


def test_tikhonov_dual_form_equals_primal():
  """W^-1 J^T (J W^-1 J^T + lam I)^-1 == (J^T J + lam W)^-1 J^T on a small random Jacobian."""
  rng = np.random.default_rng(0)
  disk = (ph.pixel_centres(128)[:, :, 0] ** 2).sum(-1).reshape(-1) <= 1
  small = rng.standard_normal((208, 300))
  jac = np.zeros((208, 128 * 128))
  jac[:, np.flatnonzero(disk)[:300]] = small  # the other pixels see nothing
  t = tikhonov.Tikhonov(jac=jac.reshape(208, 128, 128), alpha=0.1, noser_exponent=1.0)
  w = (small * small).sum(0)
  lam = 0.1 * np.trace((small / w) @ small.T) / 208
  primal = np.linalg.solve(small.T @ small + lam * np.diag(w), small.T)
  assert np.all(t.matrix[300:] == 0)
  np.testing.assert_allclose(t.matrix[:300], primal, rtol=1e-6, atol=1e-9)


def test_tikhonov_finds_a_disc():
  sim = eit.default_simulator(CDEIT16)
  params = disc(0.45, -0.3, 0.2, 10.0)
  ys = np.asarray(sim.phantom_voltages(params[None], 40.0, jax.random.split(jax.random.key(1), 1)))
  rec = eit.default_tikhonov(CDEIT16)(ys)[0]
  target = np.asarray(ph.render_image(jnp.asarray(params, jnp.float32)))
  assert rec.shape == (128, 128) and rec[0, 0] == 0
  row, col = np.unravel_index(np.argmax(rec), rec.shape)  # conductive: a positive peak
  x, y = (col - 63.5) / 64, (row - 63.5) / 64
  assert np.hypot(x - 0.45, y + 0.3) < 0.15
  assert np.corrcoef(rec.ravel(), target.ravel())[0, 1] > 0.5


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


def test_drift_scales_the_target_frame_alone(sim64):
  """`SystemSpec.drift`: the target frame's voltages times the drift, the empty tank's not
  (noise-free: ys = drift * gain * v(sigma) - gain * v(1), both solved here by the CEM); its
  draws stay in their range, and adding it leaves every other draw of a key as it was."""
  spec = eit.SystemSpec(drift=(0.9, 1.1))
  keys = jax.random.split(jax.random.key(1), 200)
  with_drift = jax.vmap(lambda k: eit.system.draw(k, spec, 0.01, CDEIT16))(keys)
  without = jax.vmap(lambda k: eit.system.draw(k, eit.SystemSpec(), 0.01, CDEIT16))(keys)
  drift = np.asarray(with_drift.drift, np.float64)
  assert 0.9 - 1e-6 <= drift.min() and drift.max() <= 1.1 + 1e-6 and drift.std() > 0.04
  for name in ("centres", "half_widths", "weights", "gain", "snr_offset_db"):
    np.testing.assert_array_equal(getattr(with_drift, name), getattr(without, name))
  rng = np.random.default_rng(4)
  sigma = np.exp(0.5 * rng.standard_normal((3, sim64.mesh.num_elements)))
  with jax.enable_x64(True):
    systems = jax.tree.map(lambda a: np.asarray(a[:3], np.float64), with_drift)
    ys = np.asarray(sim64.system_difference(sigma, systems))
    cem = eit.CEM(sim64.mesh, dtype="float64", layout=CDEIT16)
    for i in range(3):
      one = jax.tree.map(lambda a: a[i], systems)
      vi = np.asarray(cem.voltages(sigma[i], one)) * one.gain
      vh = np.asarray(cem.voltages(np.ones_like(sigma[i]), one)) * one.gain
      np.testing.assert_allclose(ys[i], one.drift * vi - vh, rtol=1e-9, atol=1e-12)
  with pytest.raises(InputError, match="drift"):
    eit.SystemSpec(drift=(0.4, 1.0)).validate()


@pytest.mark.parametrize(
  "kind, b, p", [("polygon", 0.0, 3), ("polygon", 0.0, 6), ("rectangle", 0.5, 0), ("star", 0.3, 5)]
)
def test_new_shapes_render_their_areas(kind, b, p):
  """Area of the rendered label image against the shape's area by hand (bounding radius a):
  regular n-gon n/2 a^2 sin(2 pi/n); rectangle with corners on the circle, sides in ratio b,
  corners rounded by r = hy/4: 4 hx hy - (4 - pi) r^2; star r(phi) = a (1 - b (1 - cos 5 phi)/2):
  1/2 integral r^2 dphi = pi a^2 ((1 - b/2)^2 + b^2/8)."""
  a = 0.4
  params = np.zeros((ph.MAX_INCLUSIONS, ph.ROW))
  params[0] = [1, eit.spec.KINDS.index(kind), 0.1, -0.2, a, b, 0.3, 1.0, p]
  img = np.asarray(ph.render_image(jnp.asarray(params, jnp.float32)))
  area = img.sum() * (2 / ph.IMAGE_SIZE) ** 2
  if kind == "polygon":
    want = p / 2 * a * a * np.sin(2 * np.pi / p)
  elif kind == "rectangle":
    hx = a / np.sqrt(1 + b * b)
    hy, r = b * hx, b * hx / 4
    want = 4 * hx * hy - (4 - np.pi) * r * r
  else:
    want = np.pi * a * a * ((1 - b / 2) ** 2 + b * b / 8)
  assert area == pytest.approx(want, rel=2e-3)
