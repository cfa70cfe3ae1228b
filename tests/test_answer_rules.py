"""KTC2023's answer rules (`cdeit_jax.infer.answer_rules`) by hand. (The batched score:
test_ktc_score.py; the rule study: test_answer_study.py.)"""

import pathlib

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.data import phantom_stats
from cdeit_jax.infer import answer_study
from cdeit_jax.infer.answer_rules import AnswerRule, probabilities

REPO = pathlib.Path(__file__).parent.parent
LEVEL_1 = REPO / "data" / "ktc2023" / "levels" / "level_1"


def test_rules_by_hand():
  """Four samples of a 1 x 4 image: the mean rule thresholds their mean, the vote rule the
  fraction of samples beyond the threshold, each class taken where its fraction reaches Q and
  beats the other's; probabilities are those fractions."""
  s = np.array(
    [[0.5, -0.5, 0.5, 0.0], [0.5, -0.5, -0.5, 0.0], [0.5, 0.5, -0.5, 0.0], [-0.1, -0.5, 0.5, 1.6]]
  )
  s = s[:, None, None, :]  # (K=4, N=1, H=1, W=4)
  # means 0.35, -0.25, 0, 0.4
  np.testing.assert_array_equal(AnswerRule("mean", 0.3).answer(s)[0, 0], [2, 0, 0, 2])
  np.testing.assert_array_equal(AnswerRule("mean", 0.2).answer(s)[0, 0], [2, 1, 0, 2])
  p_res, p_con = probabilities(s, 0.3)
  np.testing.assert_array_equal(p_con[0, 0], [0.75, 0.25, 0.5, 0.25])
  np.testing.assert_array_equal(p_res[0, 0], [0.0, 0.75, 0.5, 0.0])
  # pixel 2: a tie of 0.5 and 0.5 is water; pixel 3: 0.25 < Q
  np.testing.assert_array_equal(AnswerRule("vote", 0.3, 0.5).answer(s)[0, 0], [2, 1, 0, 0])
  np.testing.assert_array_equal(AnswerRule("vote", 0.3, 0.25).answer(s)[0, 0], [2, 1, 0, 2])
  np.testing.assert_array_equal(AnswerRule("vote", 0.3, 0.8).answer(s)[0, 0], [0, 0, 0, 0])


def test_small_classes_are_dropped_by_area():
  """`area=A` answers a class as water where it covers less than A of the tank (the disk's
  12,892 pixels of 128 x 128): a 100-pixel spot (0.78 %) goes at A = 0.01, stays at 0.005, and
  the other class's large region stays either way."""
  image = np.zeros((128, 128))
  image[20:30, 60:70] = 1.0  # 100 pixels conductive
  image[50:100, 40:90] = -1.0  # 2,500 pixels resistive
  samples = np.repeat(image[None, None], 3, 0)
  assert phantom_stats.objects(np.where(image > 0, 2, 0))[0].area == pytest.approx(100 / 12892)
  kept = AnswerRule("mean", 0.3, min_area=0.005).answer(samples)[0]
  dropped = AnswerRule("vote", 0.3, 0.5, min_area=0.01).answer(samples)[0]
  assert (kept == 2).sum() == 100 and (kept == 1).sum() == 2500
  assert (dropped == 2).sum() == 0 and (dropped == 1).sum() == 2500


def test_rule_strings():
  for text in (
    "mean:0.3",
    "vote:0.3:0.5",
    "vote:0.25:0.75:area=0.01",
    "mean:0.4:area=0.02",
    "argmax",
    "argmax:area=0.005",
    "argmax:water=0.9",
    "argmax:water=0.8:area=0.01",
  ):
    assert str(AnswerRule.parse(text)) == text
  for bad in (
    "median:0.3",
    "mean",
    "vote:0.3",
    "mean:x",
    "mean:-1",
    "vote:0.3:2",
    "mean:0.3:area=1",
    "argmax:0.5",
    "argmax:water=0",
    "argmax:water=x",
    "argmax:water=0.9:water=0.8",
    "mean:0.3:water=0.9",
    "argmax:wet=0.9",
  ):
    with pytest.raises(InputError, match="--config.eval.answer_rule=.*write mean:T, vote:T:Q or"):
      AnswerRule.parse(bad)


def test_argmax_answers_a_segmenters_most_probable_class_and_reads_nothing_else():
  """Probabilities (water, resistive, conductive) by hand: each pixel's largest wins, even below
  one half; `water=` weighs water's probability first; `area=` drops a small class as for
  samples; a rule refuses the other kind of model."""
  p = np.zeros((1, 128, 128, 3))
  p[..., 0] = 1.0
  p[0, 10:50, 10:50] = (0.3, 0.3, 0.4)  # conductive, 1,600 pixels (12 %)
  p[0, 90:95, 90:95] = (0.2, 0.45, 0.35)  # resistive, 25 pixels (0.2 %)
  want = np.zeros((1, 128, 128), np.uint8)
  want[0, 10:50, 10:50] = 2
  want[0, 90:95, 90:95] = 1
  np.testing.assert_array_equal(AnswerRule.parse("argmax").answer(p), want)
  want[0, 90:95, 90:95] = 0
  np.testing.assert_array_equal(AnswerRule.parse("argmax:area=0.005").answer(p), want)
  # water weighted by 0.8: pixels at (0.45, 0.40, 0.15) answer resistive (0.36 < 0.40; 100
  # pixels, 0.8 %, kept), pixels at (0.55, 0.40, 0.05) stay water (0.44 > 0.40)
  q = p.copy()
  q[0, 60:70, 60:70] = (0.45, 0.40, 0.15)
  q[0, 70:80, 60:70] = (0.55, 0.40, 0.05)
  got = AnswerRule.parse("argmax:water=0.8:area=0.005").answer(q)
  np.testing.assert_array_equal(AnswerRule.parse("argmax:area=0.005").answer(q), want)
  weighted = want.copy()
  weighted[0, 60:70, 60:70] = 1
  weighted[0, 90:95, 90:95] = 1  # the resistive class is now 125 pixels in all: kept
  np.testing.assert_array_equal(got, weighted)
  with pytest.raises(InputError, match="argmax: the model is a sampler of images"):
    AnswerRule.parse("argmax").check_model(segmenter=False)
  with pytest.raises(InputError, match=r"vote:0.2:0.5: the model is a segmenter .*argmax"):
    AnswerRule.parse("vote:0.2:0.5").check_model(segmenter=True)
  AnswerRule.parse("mean:0.3").check_model(segmenter=False)
  # the study scores a segmenter's rules on its probabilities: the truth's own classes score 1
  truth = want
  onehot = np.eye(3)[truth]
  s = answer_study.score_rules(answer_study.default_rules(segmenter=True), onehot, truth)
  np.testing.assert_allclose(s, 1.0, atol=1e-12)
