"""KTC2023's answer rules (`cdeit_jax.infer.answer_rules`), the batched challenge score
(`ktc_score.Scorer`) against the one-target score, and the rule study's pieces
(`cdeit_jax.infer.answer_study`)."""

import pathlib

import numpy as np
import pytest
import scipy.io

from cdeit_jax.common.errors import InputError
from cdeit_jax.data import phantom_stats
from cdeit_jax.infer import answer_study, ktc_score
from cdeit_jax.infer.answer_rules import AnswerRule, probabilities

REPO = pathlib.Path(__file__).parent.parent
LEVEL_1 = REPO / "data" / "ktc2023" / "levels" / "level_1"


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


def test_the_study_scores_rules_on_truths_it_can_recover():
  """Samples equal to the truth's classes (+-1 label units) score 1 under every rule that keeps
  small classes (and on the challenge's grid as on ours); with one object of each class, a rule
  dropping classes under 2 % loses the 1 % one; the simulated truth is the label image's
  classes at +-0.25."""
  truth = np.zeros((2, 128, 128), np.uint8)
  truth[0, 30:60, 30:60] = 2  # 900 pixels, 7 %
  truth[1, 30:60, 30:60] = 2
  truth[1, 80:91, 80:91] = 1  # 121 pixels, 0.94 %
  labels = np.where(truth == 2, 1.0, np.where(truth == 1, -1.0, 0.0))
  samples = np.repeat(labels[None], 4, 0)
  rules = [
    AnswerRule("mean", 0.3),
    AnswerRule("vote", 0.4, 0.75),
    AnswerRule("mean", 0.3, min_area=0.02),
  ]
  s = answer_study.score_rules(rules, samples, truth, extra=(truth, 0 * truth))
  np.testing.assert_allclose(s[:2], 1.0, atol=1e-12)
  assert s[2, 0] == pytest.approx(1.0) and s[2, 1] < 0.6
  # the ready answer sets after the rules: the truth itself, and all water (the one-target score)
  np.testing.assert_allclose(s[3], 1.0, atol=1e-12)
  big = ktc_score.to_challenge_grid(truth)
  water = [ktc_score.score(t, 0 * t) for t in big]
  np.testing.assert_allclose(s[4], water, atol=1e-7)
  s_big = answer_study.score_rules(rules, samples, big, extra=(big, 0 * big))
  np.testing.assert_allclose(s_big, s, atol=1e-7)
  np.testing.assert_array_equal(phantom_stats.class_map(0.3 * labels), truth)
  np.testing.assert_array_equal(phantom_stats.class_map(0.2 * labels), 0 * truth)


def test_the_rule_chosen_stands_best_on_its_worse_source():
  """Standings by hand: rule a is best on the simulations and poor on the public cases, b the
  reverse, c second on both; c's worse standing, (0.6 - 0.3) / (0.7 - 0.3) = 0.75, beats a's
  (15 - 7) / (22 - 7) = 0.53 and b's (0.4 - 0.3) / 0.4 = 0.25, so c is chosen."""
  sims = {"a": 0.7, "b": 0.4, "c": 0.6, "water": 0.3}
  public = {"a": 15.0, "b": 22.0, "c": 19.0, "water": 7.0}
  result = {
    "simulations": {"mean_per_target": {n: {"all": v} for n, v in sims.items()}},
    "public": {"score": {n: {"total": v} for n, v in public.items()}},
  }
  s = answer_study.standing(result, ["a", "b", "c"])
  assert s == {"a": pytest.approx(8 / 15, abs=1e-4), "b": 0.25, "c": 0.75}
  del result["public"]
  assert max(answer_study.standing(result, ["a", "b", "c"]).items(), key=lambda x: x[1])[0] == "a"


def test_the_oracle_row_is_the_best_candidate_per_target_and_only_among_the_rules():
  """By hand: rule 0 wins target 0 (0.9), rule 1 target 1 (0.8), so the oracle scores 0.9 and 0.8,
  above every single rule's mean; the ready answer sets after the rules (Tikhonov 0.95 on target
  1) are not candidates."""
  scores = np.array([[0.9, 0.2], [0.1, 0.8], [0.5, 0.5], [0.3, 0.95], [0.2, 0.2]])
  out = answer_study.with_oracle(scores, num_rules=3)
  np.testing.assert_array_equal(out[:5], scores)
  np.testing.assert_array_equal(out[5], [0.9, 0.8])
  assert out[5].mean() > out[:3].mean(axis=1).max()


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


def test_the_study_reads_several_simulated_splits_in_order(tmp_path):
  """--sims A,B: the first `num` examples of each split, A's before B's, their values the first
  column of `ys` and their truths the label images' classes at +-0.25 (by hand: 0.3 conductive,
  -0.3 resistive, 0.2 water); a folder without examples is named in one line."""
  rng = np.random.default_rng(0)
  written = {}
  for name, n in (("a", 3), ("b", 2)):
    (tmp_path / name).mkdir()
    for i in range(n):
      ys = rng.normal(size=(5, 1))
      xs = np.zeros((128, 128), np.float32)
      xs[:10, :10], xs[20:30, :5], xs[40:, 40:] = 0.3, -0.3, 0.2 * (i + 1) / 3
      np.savez(tmp_path / name / f"{i:07d}.npz", ys=ys, xs=xs)
      written[name, i] = ys[:, 0], xs
  values, truths = answer_study.simulated(f"{tmp_path / 'a'},{tmp_path / 'b'}", 2)
  order = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
  np.testing.assert_array_equal(values, np.stack([written[k][0] for k in order]))
  assert truths.shape == (4, 128, 128) and (truths[:, :10, :10] == 2).all()
  assert (truths[:, 20:30, :5] == 1).all() and (truths[:, 40:, 40:] == 0).all()
  assert truths.sum() == 4 * (100 * 2 + 50 * 1)
  with pytest.raises(InputError, match=r"--sims .*empty: no simulated examples") as e:
    (tmp_path / "empty").mkdir()
    answer_study.simulated(f"{tmp_path / 'a'},{tmp_path / 'empty'}", 2)
  assert "\n" not in str(e.value)
