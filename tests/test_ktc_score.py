"""infer.ktc_score: KTC2023's score against the organisers' formula written out, and the
batched scorer against the one-target score."""

import pathlib

import numpy as np
import pytest
import scipy.io
import scipy.signal

from cdeit_jax.common.errors import InputError
from cdeit_jax.infer import ktc_score

REPO = pathlib.Path(__file__).parent.parent
LEVEL_1 = REPO / "data" / "ktc2023" / "levels" / "level_1"


def test_score_is_the_organisers_ssim():
  """The separable SSIM equals the organisers' formula written out with a 2-D convolution
  (their kernel over +-160 pixels, normalised by its weight inside the image); identical
  answers score 1; a class absent from truth and answer scores exactly 1 for that class."""
  rng = np.random.default_rng(3)
  truth = np.zeros((256, 256))
  yy, xx = np.mgrid[:256, :256]
  truth[(yy - 90) ** 2 + (xx - 150) ** 2 < 40**2] = 1
  reco = np.roll(truth, (12, -7), (0, 1)) * (rng.random((256, 256)) > 0.05)
  r = 80
  w = np.arange(-160, 161)
  ker = np.exp(-0.5 * (w[:, None] ** 2 + w[None] ** 2) / r**2) / np.sqrt(2 * np.pi)
  conv = lambda a: scipy.signal.fftconvolve(a, ker, mode="same")
  norm = conv(np.ones_like(truth))
  gt, gr = conv(truth) / norm, conv(reco) / norm
  st, sr = conv(truth**2) / norm - gt**2, conv(reco**2) / norm - gr**2
  s_tr = conv(truth * reco) / norm - gt * gr
  c1, c2 = 1e-4, 9e-4
  organisers = np.mean(
    (2 * gt * gr + c1) * (2 * s_tr + c2) / ((gt**2 + gr**2 + c1) * (st + sr + c2))
  )
  assert ktc_score.ssim(truth, reco) == pytest.approx(organisers, rel=1e-9)
  classes = (2 * truth).astype(np.uint8)  # only class 2 present
  assert ktc_score.score(classes, classes) == pytest.approx(1.0)
  water = ktc_score.score(classes, np.zeros_like(classes))
  assert water == pytest.approx(0.5 * (ktc_score.ssim(truth, np.zeros_like(truth)) + 1.0))
  assert ktc_score.score(classes, np.zeros((128, 128))) == 0.0  # the wrong shape scores 0


def _truths() -> np.ndarray:
  return np.stack([scipy.io.loadmat(LEVEL_1 / f"true{t}.mat")["truth"] for t in range(1, 5)])


def test_scorer_is_the_one_target_score_on_both_grids():
  """The matrix form equals `score` (the organisers' formula, tests/test_layout.py) to 1e-12 in
  float64 and to 1e-7 in float32 (the default): the public truths against shifted, emptied and
  spotted answers on the challenge's grid, and random class maps on ours (scored as their
  `to_challenge_grid`); one Scorer scores several answer sets against its truths."""
  truths = _truths()
  answers = np.stack([np.roll(t, 9 * i, axis=1) for i, t in enumerate(truths)])
  answers[1] = 0
  answers[2, 100:120, 30:60] = 1
  want = [ktc_score.score(t, a) for t, a in zip(truths, answers)]
  exact = ktc_score.Scorer(truths, np.float64)
  np.testing.assert_allclose(exact(answers), want, rtol=0, atol=1e-12)
  scorer = ktc_score.Scorer(truths)
  np.testing.assert_allclose(scorer(answers), want, rtol=0, atol=1e-7)
  np.testing.assert_allclose(scorer(truths), 1.0, rtol=0, atol=1e-7)  # the same scorer again
  assert want[0] == pytest.approx(1.0) and max(want[1:]) < 0.99  # unshifted; the others
  rng = np.random.default_rng(0)
  small_t = rng.integers(0, 3, (5, 128, 128)).astype(np.uint8)
  small_a = np.where(rng.random((5, 128, 128)) < 0.7, small_t, 0).astype(np.uint8)
  small_t[0] = 0  # a target without either class
  want = [
    ktc_score.score(ktc_score.to_challenge_grid(t), ktc_score.to_challenge_grid(a))
    for t, a in zip(small_t, small_a)
  ]
  np.testing.assert_allclose(
    ktc_score.Scorer(small_t, np.float64)(small_a), want, rtol=0, atol=1e-12
  )
  np.testing.assert_allclose(ktc_score.Scorer(small_t)(small_a), want, rtol=0, atol=1e-7)
  with pytest.raises(InputError, match="need \\(N, 256, 256\\) or \\(N, 128, 128\\)"):
    scorer(small_a)
  with pytest.raises(InputError, match="need \\(N, 256, 256\\) or \\(N, 128, 128\\)"):
    ktc_score.Scorer(small_t[0])
