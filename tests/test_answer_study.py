"""infer.answer_study: the rule study's pieces (scores per rule, the choice, the oracle row,
several simulated splits)."""

import pathlib

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.data import phantom_stats
from cdeit_jax.infer import answer_study, ktc_score
from cdeit_jax.infer.answer_rules import AnswerRule

REPO = pathlib.Path(__file__).parent.parent
LEVEL_1 = REPO / "data" / "ktc2023" / "levels" / "level_1"


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


def test_the_rule_is_chosen_on_the_simulations_and_standings_report_both():
  """Standings by hand: rule a is best on the simulations and poor on the public cases, b the
  reverse, c second on both; c's worse standing, (0.6 - 0.3) / (0.7 - 0.3) = 0.75, beats a's
  (15 - 7) / (22 - 7) = 0.53 and b's (0.4 - 0.3) / 0.4 = 0.25, yet a is chosen: the public
  cases are a test; without simulations nothing is."""
  sims = {"a": 0.7, "b": 0.4, "c": 0.6, "water": 0.3}
  public = {"a": 15.0, "b": 22.0, "c": 19.0, "water": 7.0}
  result = {
    "simulations": {"mean_per_target": {n: {"all": v} for n, v in sims.items()}},
    "public": {"score": {n: {"total": v} for n, v in public.items()}},
  }
  s = answer_study.standing(result, ["a", "b", "c"])
  assert s == {"a": pytest.approx(8 / 15, abs=1e-4), "b": 0.25, "c": 0.75}
  assert answer_study.choose(result, ["a", "b", "c"]) == "a"
  del result["simulations"]
  assert answer_study.choose(result, ["a", "b", "c"]) is None


def test_the_oracle_row_is_the_best_candidate_per_target_and_only_among_the_rules():
  """By hand: rule 0 wins target 0 (0.9), rule 1 target 1 (0.8), so the oracle scores 0.9 and 0.8,
  above every single rule's mean; the ready answer sets after the rules (Tikhonov 0.95 on target
  1) are not candidates."""
  scores = np.array([[0.9, 0.2], [0.1, 0.8], [0.5, 0.5], [0.3, 0.95], [0.2, 0.2]])
  out = answer_study.with_oracle(scores, num_rules=3)
  np.testing.assert_array_equal(out[:5], scores)
  np.testing.assert_array_equal(out[5], [0.9, 0.8])
  assert out[5].mean() > out[:3].mean(axis=1).max()


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


def test_targets_are_grouped_by_their_held_out_family(tmp_path):
  """`families` reads the heldout.json beside each split, in the files' order and count (a
  folder without one: None); `family_means` by hand."""
  import json

  groups = {"few": ["letters", "blobs", "letters"], "many": ["thin", "touching"]}
  for group, fams in groups.items():
    (tmp_path / group).mkdir()
    for i in range(len(fams)):
      (tmp_path / group / f"{i:07d}.npz").write_bytes(b"")
  record = {"groups": {g: {"families": f} for g, f in groups.items()}}
  (tmp_path / "heldout.json").write_text(json.dumps(record))
  got = answer_study.families(f"{tmp_path / 'few'},{tmp_path / 'many'}/", 2)
  assert got.tolist() == ["letters", "blobs", "thin", "touching"]
  (tmp_path / "sim" / "valid").mkdir(parents=True)
  (tmp_path / "sim" / "valid" / "0000000.npz").write_bytes(b"")
  assert answer_study.families(str(tmp_path / "sim" / "valid"), 5) is None
  assert answer_study.families(f"{tmp_path / 'few'},{tmp_path / 'sim' / 'valid'}", 5) is None
  means = answer_study.family_means(np.array([1.0, 0.5, 0.0, 0.25]), np.array(["a", "b", "a", "b"]))
  assert means == {"a": 0.5, "b": 0.375}
