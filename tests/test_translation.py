"""`eit.translation`: a device's difference values translated into another protocol's on the same
electrodes, checked against the simulator's values of that protocol for the same conductivity
(a second computation: the forward model solved for the other currents) and against the real
tank's own adjacent frames of the same 22 targets (data/uef2017), measured separately."""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit import translation
from cdeit_jax.eit.simulator import add_noise, default_simulator

REPO = pathlib.Path(__file__).parent.parent
PROTOCOLS = REPO / "data" / "uef2017_protocols"
WIDTH, Z = np.deg2rad(10.2), 0.01


def _on(layout):
  return dataclasses.replace(layout, width=WIDTH, contact_impedance=Z)


@pytest.fixture(scope="module")
def images():
  """Two label images: a conductive disc; a resistive and a conductive one."""
  yy, xx = np.mgrid[-1:1:128j, -1:1:128j]
  xs = np.zeros((2, 128, 128), np.float32)
  xs[0][(xx - 0.4) ** 2 + (yy + 0.2) ** 2 < 0.2**2] = 1.0
  xs[1][(xx + 0.3) ** 2 + (yy - 0.3) ** 2 < 0.25**2] = -1.0
  xs[1][(xx - 0.3) ** 2 + (yy + 0.4) ** 2 < 0.15**2] = 1.0
  return xs


def _values(layout, xs):
  return np.asarray(default_simulator(layout=layout).image_voltages(xs), np.float64)


def _error(got, want):
  return np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)


def test_a_full_protocol_translates_exactly_by_reciprocity(images):
  """Skip-2 currents reach every electrode: with noise-free values (noise_db 80) the adjacent
  protocol's values follow from them to 0.2 %, through the nonlinear problem (the images' contrast
  is 10x); at the training noise's setting, with 40 dB noise added, within 6 %."""
  target = _on(lay.preset("cdeit16"))
  device = _on(lay.from_rules(16, injection="skip-2", measure_injecting=True))
  want, v = _values(target, images), _values(device, images)
  exact = translation.Translator.between(device, target, noise_db=80.0)
  assert _error(exact(v), want).max() < 2e-3
  noisy = np.asarray(add_noise(jax.numpy.asarray(v), 40.0, jax.random.key(0)))
  tr = translation.Translator.between(device, target)
  assert _error(tr(noisy), want).max() < 0.06
  assert tr.determined() > 0.999


def test_what_the_currents_do_not_reach_is_estimated(images):
  """Skip-1 currents reach only even-to-even and odd-to-odd differences: one number of the
  transfer matrix is estimated from the prior, and the adjacent values still follow within 6 %;
  a frame missing one pattern's values translates from the rest within 6 % too."""
  target = _on(lay.preset("cdeit16"))
  device = _on(lay.from_rules(16, injection="skip-1", measure_injecting=True))
  want, v = _values(target, images), _values(device, images)
  tr = translation.Translator.between(device, target)
  assert _error(tr(v), want).max() < 0.06
  missing = v.copy()
  missing[1, :16] = np.nan
  got = tr(missing)
  assert np.isfinite(got).all()
  assert _error(got, want).max() < 0.06
  assert np.isnan(tr(np.full((1, device.num_values), np.nan))).all()


def test_electrodes_are_matched_by_place(images):
  """A device numbering the same electrodes from another one translates to the same values
  (noise-free, noise_db 80: both exact); 32
  electrodes, or 16 half a spacing off, are not the model's and are refused naming both."""
  target = _on(lay.preset("cdeit16"))
  device = _on(lay.from_rules(16, injection="skip-2", measure_injecting=True))
  shift = 5  # electrode k of the turned device is electrode k + 5 of the first
  turned = dataclasses.replace(device, angles=np.roll(device.angles, -shift))
  np.testing.assert_array_equal(
    translation.electrode_order(turned, target), (np.arange(16) - shift) % 16
  )
  a = translation.Translator.between(device, target, noise_db=80.0)(_values(device, images))
  b = translation.Translator.between(turned, target, noise_db=80.0)(_values(turned, images))
  assert _error(b, a).max() < 2e-3
  half = dataclasses.replace(device, angles=device.angles + np.pi / 16)
  assert translation.electrode_order(half, target) is None
  with pytest.raises(InputError, match="has not the electrodes of cdeit16"):
    translation.Translator.between(_on(lay.from_rules(32)), target)


@pytest.mark.parametrize("protocol", ["skip1", "skip3"])
def test_the_tanks_frames_translate_into_its_adjacent_frames(protocol):
  """UEF2017's tank: its skip-k frames of the 22 targets (data/uef2017_protocols), translated at
  their calibration's width and contact impedance, against the adjacent frames the tank measured
  of the same targets (data/uef2017, the same volts): median relative error under 9 % (7.2 % and
  7.4 % measured), where the frames' own scale is off by 100 %."""
  device, ref = lay.from_device_file(str(PROTOCOLS / protocol / "ref.mat"))
  device = dataclasses.replace(device, width=np.deg2rad(14.5), contact_impedance=0.024)
  tr = translation.Translator.between(device, lay.preset("cdeit16"))
  frames = np.load(PROTOCOLS / protocol / "frames.npy")
  names = (PROTOCOLS / protocol / "names.txt").read_text().split()
  adjacent = np.stack([np.load(REPO / "data" / "uef2017" / f"{n}.npz")["ys"][:, 0] for n in names])
  err = _error(tr(frames - ref), adjacent)
  assert np.median(err) < 0.09
  assert err.max() < 0.3
