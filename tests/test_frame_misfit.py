"""cdeit_jax.infer.frame_misfit: how well a class map explains a KTC2023 frame, on the public
level-1 target 1 (real frames and truth, data/ktc2023): the truth fits its frame below answers
made worse from it, and best with the tank's electrodes where `layout.KTC_FIRST_DEG` puts them."""

import dataclasses

import jax
import numpy as np
import pytest
from conftest import REPO

from cdeit_jax.data import ktc2023
from cdeit_jax.eit import layout as lay
from cdeit_jax.eit.simulator import Simulator
from cdeit_jax.infer import challenge, frame_misfit, ktc_score

LEVELS = REPO / "data" / "ktc2023" / "levels"


@pytest.fixture(scope="module")
def target1():
  cases = [c for c in ktc2023.read_cases(str(LEVELS)) if c.level == 1 and c.target == 1]
  fits = challenge.calibrate(cases)
  c = cases[0]
  return c, challenge.calibrated_values(cases, fits)[0], challenge.calibrated_device(c, fits)


def _fitter(device):
  with jax.enable_x64(True):
    return frame_misfit.Fitter(Simulator(layout=device.physics, dtype=np.float64), (2.0,))


def test_classes_read_the_challenge_grid():
  m = np.zeros((128, 128), np.uint8)
  m[10:30, 40:70], m[80:100, 20:30] = 1, 2
  np.testing.assert_array_equal(frame_misfit.classes(ktc_score.to_challenge_grid(m)), m)
  v = frame_misfit.variants(m)
  assert (v["truth_swapped"] == np.where(m == 1, 2, np.where(m == 2, 1, 0))).all()
  assert (v["truth_grown"] > 0).sum() > (m > 0).sum() > (v["truth_shrunk"] > 0).sum() > 0
  assert not v["water"].any() and (v["truth_moved"][:, 8:] == m[:, :-8]).all()


def test_the_truth_fits_its_frame_below_worse_answers(target1):
  """The measured frame rejects answers made worse from the truth (moved by an eighth of the
  radius, classes swapped, all water): each misfits it more than the truth does."""
  c, d, device = target1
  fitter = _fitter(device)
  truth = frame_misfit.classes(c.truth)
  with jax.enable_x64(True):
    got = {n: fitter.fit(d, m)["misfit"] for n, m in frame_misfit.variants(truth).items()}
    got["truth"] = fitter.fit(d, truth)["misfit"]
  assert got["water"] == pytest.approx(1.0, abs=0.02)  # drift alone explains nothing
  assert got["truth"] < 0.2 < got["truth_moved"] and got["truth_swapped"] > 1.0, got


def test_the_tanks_electrodes_sit_where_the_truths_fit_best(target1):
  """Electrode 0 at the top (90 degrees: `KTC_FIRST_DEG`), not at the organisers' mesh's 84.375
  degrees: the truth fits its frame with the electrodes there at a clearly lower misfit."""
  c, d, device = target1
  assert np.rad2deg(device.angles[0]) == pytest.approx(lay.KTC_FIRST_DEG) == pytest.approx(90.0)
  mesh = dataclasses.replace(device, angles=device.angles - np.deg2rad(5.625))
  truth = frame_misfit.classes(c.truth)
  with jax.enable_x64(True):
    at_top = _fitter(device).fit(d, truth)["misfit"]
    at_mesh = _fitter(mesh).fit(d, truth)["misfit"]
  assert at_top < 0.8 * at_mesh, (at_top, at_mesh)
