"""The simulator (`eit.simulator`): noise at its SNR, image and phantom voltages alike, checked
shapes, a drifting target frame, and the real UEF2017 labels explaining their measurements."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import disc_params, rel_l2

from cdeit_jax import eit
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import phantom as ph
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_images_drive_the_same_model_as_phantoms(sim64):
  """simulate from the rendered label image == from the phantom (up to pixelisation)."""
  params = disc_params(-0.3, 0.4, 0.3, 10.0)
  with jax.enable_x64(True):
    from_phantom = np.asarray(sim64.phantom_voltages(params))
    img = ph.render_image(jnp.asarray(params), supersample=1)
    from_image = np.asarray(sim64.image_voltages(img[None]))[0]
  assert np.corrcoef(from_image, from_phantom)[0, 1] > 0.999
  assert rel_l2(from_image, from_phantom) < 0.05


def test_noise_is_40db_on_each_vector():
  sim = eit.default_simulator(CDEIT16)
  params = np.repeat(disc_params(0.2, 0.2, 0.3, 10.0)[None], 64, 0)
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


def test_simulate_voltages_checks_shape():
  with pytest.raises(ValueError, match="xs_images must be"):
    eit.simulate_voltages(np.zeros((128, 128)))
  with pytest.raises(ValueError, match="PRNG key"):
    eit.simulate_voltages(np.zeros((1, 128, 128)), snr_db=40.0)


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
