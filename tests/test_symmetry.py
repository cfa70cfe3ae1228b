"""The tank's turns and mirror (`eit.symmetry`, `eit.turns.turn`): they permute the simulator's
voltages, another device's too, and a value-reading model's condition turns with its tank."""

import numpy as np
import pytest
from conftest import rel_l2

from cdeit_jax import eit
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values


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


def _disc(angle_deg: float, r: float = 0.55, size: float = 0.2) -> np.ndarray:
  """Our grid (128, 128; rows growing with +y): a conductive disc at polar angle `angle_deg`."""
  c = (np.arange(128) - 63.5) / 64
  x, y = np.meshgrid(c, c)
  a = np.deg2rad(angle_deg)
  return (((x - r * np.cos(a)) ** 2 + (y - r * np.sin(a)) ** 2) < size**2).astype(np.float32)


def test_a_device_turned_from_the_models_measures_the_object_turned_back():
  """`turns.offset` finds the angle a device's electrodes are a model's turned by (None for any
  other difference), and the simulator is the truth of what that means: the device's frame of
  an object is the model's frame of the object turned back by that angle, and the model's image
  turned by it (`turns.turn_images`, `Reconstruction.turned`) is where the object lies."""
  from cdeit_jax.eit import turns
  from cdeit_jax.eit.simulator import Simulator
  from cdeit_jax.infer.reconstructor import Reconstruction

  model = lay.from_rules(16, "adjacent")
  delta = np.deg2rad(7.5)
  device = lay.Layout("turned", model.angles + delta, model.width, model.currents, model.rows)
  assert turns.offset(model, device) == pytest.approx(delta)
  assert turns.offset(model, model) == 0.0
  wider = lay.Layout("wider", model.angles + delta, model.width * 1.2, model.currents, model.rows)
  uneven = lay.Layout(
    "uneven", model.angles + delta * (np.arange(16) < 8), model.width, model.currents, model.rows
  )
  assert turns.offset(model, wider) is None and turns.offset(model, uneven) is None
  assert turns.offset(model, lay.from_rules(16, "skip-2")) is None
  on_device = Simulator(layout=device).image_voltages(_disc(40.0)[None])
  on_model = Simulator(layout=model).image_voltages(_disc(40.0 - 7.5)[None])
  elsewhere = Simulator(layout=model).image_voltages(_disc(40.0 + 7.5)[None])
  assert rel_l2(on_model, on_device) < 0.05 < 0.5 < rel_l2(elsewhere, on_device)
  # the model's image of the device's frame lies at 40 - 7.5 degrees; turned by delta, at 40
  image = _disc(40.0 - 7.5)
  turned = Reconstruction(
    images=image[None], probabilities=np.stack([1 - image, 0 * image, image], -1)[None]
  ).turned(delta)
  back = turns.turn_images(image, -delta)  # the other way round: further off than not turning
  assert rel_l2(turned.images[0], _disc(40.0)) < 0.2 < 0.5 < rel_l2(image, _disc(40.0))
  assert rel_l2(image, _disc(40.0)) < rel_l2(back, _disc(40.0))
  np.testing.assert_allclose(turned.probabilities[0, ..., 2], turned.images[0], atol=1e-6)
  np.testing.assert_array_equal(turns.turn_images(image, 0.0), image)
