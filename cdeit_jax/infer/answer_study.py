"""Choose KTC2023's answer rule (`answer_rules`) for a model: every candidate rule scored per
level on held-out simulations (each level's electrodes removed from every example) and on the
challenge's public cases, from one set of samples per target.

  python -m cdeit_jax.answer_study --workdir runs/ktc2023_model \\
      --sims DATA/valid[,DATA_DRIFT/valid] --num 256 --ktc data/ktc2023/levels --out study.json

The simulated target's truth is its label image's classes (`eit.phantom.class_map`), its
values the simulated differences (simulation units, as eval.py gives a calibrated case's); the
public cases are read, calibrated and sampled as eval.py's ktc2023_challenge does. The rule is
chosen on the simulations alone (validation data: the public cases are a test, reported beside,
never chosen on); each rule's standing in a source is its score above all water's as a fraction
of the best rule's there, and `standing` reports the worse of the sources' (the simulations'
distribution and the public cases' four shapes disagree on small objects). Prints a markdown table
per source and writes JSON (`metrics`, `settings`, as eval.py's metrics.json: `python -m
cdeit_jax.ship --scores` reads it): per rule, the mean score per target at each level and over
all (simulations), the score summed per level and in total (public cases), and its standing;
the Tikhonov/NOSER answers and all water beside, and `oracle`: each target answered by the
candidate that scores best on it, which needs the truth, so no rule can reach it: it bounds what
choosing among these candidates, per target or per level, could gain.
"""

from __future__ import annotations

import glob
import os
import time

import numpy as np

from cdeit_jax.common import logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.infer.answer_rules import AnswerRule

log = logs.log.getChild("answer_study")

LEVELS = range(1, 8)


AREAS = (0.0, 0.005, 0.01, 0.02)
WATER_WEIGHTS = (1.0, 0.9, 0.8)


def default_rules(segmenter: bool = False) -> list[AnswerRule]:
  """The candidates: the mean or a per-pixel vote of the samples, at four thresholds (a
  segmenter's: the most probable class, water's probability weighted by 1, 0.9 or 0.8), with or
  without dropping a class smaller than 0.5 %, 1 % or 2 % of the tank."""
  if segmenter:
    return [AnswerRule("argmax", min_area=area, water=w) for w in WATER_WEIGHTS for area in AREAS]
  rules = []
  for area in AREAS:
    for t in (0.2, 0.3, 0.4, 0.5):
      rules.append(AnswerRule("mean", t, min_area=area))
      for q in (0.5, 0.75):
        rules.append(AnswerRule("vote", t, q, min_area=area))
  return rules


def simulated(folders: str, num: int) -> tuple[np.ndarray, np.ndarray]:
  """(values (N, R), truths (N, 128, 128) class maps) of the first `num` examples of each
  simulated split in `folders` (comma-separated, in that order: a model trained on several
  distributions, e.g. frames with and without drift, is studied on all of them), from the
  `ys`, `xs` of each NNNNNNN.npz."""
  from cdeit_jax.data.npz_files import read_npz
  from cdeit_jax.eit.phantom import class_map

  paths = []
  for folder in folders.split(","):
    found = _split_files(folder, num)
    if not found:
      raise InputError(f"--sims {folder}: no simulated examples (NNNNNNN.npz); give a split folder")
    paths += found
  arrays = [read_npz(p, ("ys", "xs")) for p in paths]
  values = np.stack([a["ys"][:, 0] for a in arrays]).astype(np.float64)
  return values, np.stack([class_map(a["xs"]) for a in arrays])


def _split_files(folder: str, num: int) -> list[str]:
  """The first `num` examples (NNNNNNN.npz) of a simulated split folder, in order."""
  return sorted(glob.glob(os.path.join(folder, "[0-9]" * 7 + ".npz")))[:num]


def families(folders: str, num: int) -> np.ndarray | None:
  """Each studied target's held-out shape family (`data.heldout`: the `heldout.json` beside a
  split folder made by `python -m cdeit_jax.heldout_families`), in `simulated`'s order; None
  unless every folder has one."""
  import json

  out: list[str] = []
  for folder in folders.split(","):
    folder = folder.rstrip("/")
    record = os.path.join(os.path.dirname(folder), "heldout.json")
    count = len(_split_files(folder, num))
    if not os.path.isfile(record):
      return None
    with open(record) as fh:
      group = json.load(fh).get("groups", {}).get(os.path.basename(folder))
    if group is None or len(group["families"]) < count:
      return None
    out += group["families"][:count]
  return np.asarray(out)


def family_means(row: np.ndarray, of: np.ndarray) -> dict[str, float]:
  """The mean of per-target scores `row` within each family (`of`: each target's)."""
  return {str(f): float(np.mean(row[of == f])) for f in sorted(set(of.tolist()))}


def level_removed(lay, level: int) -> np.ndarray:
  """(R,) bool: the values KTC2023's level `level` removes (`eit.layout`'s "ktc2023" removals)."""
  from cdeit_jax.eit import layout

  return lay.without(layout.removal_sets("ktc2023")[level - 1])


def tikhonov_answers(lay, values: np.ndarray, present: np.ndarray, alpha, segment_level):
  from cdeit_jax.eit import tikhonov
  from cdeit_jax.infer import ktc_score

  images = tikhonov.of_values(lay, present, alpha)(values)
  return ktc_score.segment(images, segment_level)


def with_oracle(scores: np.ndarray, num_rules: int) -> np.ndarray:
  """scores (rules + extra, N) with one more row: per target, the best of the first `num_rules`
  rows (each target answered by the candidate that scores best on it)."""
  return np.concatenate([scores, scores[:num_rules].max(0, keepdims=True)])


def score_rules(rules, samples: np.ndarray, truths: np.ndarray, extra=()) -> np.ndarray:
  """(rules + extra, N) scores of each rule's answers of samples (K, N, 128, 128) (a
  segmenter's rules: of its class probabilities (N, 128, 128, 3)), then of each
  ready answer set in `extra` (the Tikhonov answers, all water), against truths: class maps
  (N, 128, 128) on our grid, or (N, 256, 256) on the challenge's; the truths are smoothed once
  (`ktc_score.Scorer`)."""
  from cdeit_jax.infer import ktc_score

  scorer = ktc_score.Scorer(truths)
  out = []
  for rule in rules:
    answers = rule.answer(samples)
    if truths.shape[-1] != answers.shape[-1]:
      answers = ktc_score.to_challenge_grid(answers)
    out.append(scorer(answers))
  return np.stack(out + [scorer(a) for a in extra])


def study(
  workdir: str,
  sims: str | None,
  num: int,
  ktc: str | None,
  rules: list[AnswerRule] | None,
  num_samples: int = 8,
  overrides: dict | None = None,
  refinements=(),
) -> dict:
  """The study (module docstring); with `refinements` (`refinement.Refinement`s), the first
  rule's answers refined by each against their frames, scored beside as '<rule> + <refinement>'
  (not candidates of the rule's choice: the study reports them)."""
  from cdeit_jax.infer import challenge, reconstructor, refinement

  t0 = time.perf_counter()
  overrides = {"sampling.num_samples": num_samples, **(overrides or {})}
  rec = reconstructor.Reconstructor.from_workdir(workdir, overrides=overrides)
  lay, cfg = rec.layout, rec.config
  rules = default_rules(rec.output.gives_classes) if rules is None else rules
  for rule in rules:
    rule.check_model(rec.output.gives_classes, "--rules")
  alpha, seg = challenge.linear_settings(cfg)
  names = [str(r) for r in rules] + ["tikhonov", "water", "oracle"]
  refined_names = [f"{rules[0]} + {f}" for f in refinements]
  result: dict = {"workdir": workdir, "checkpoint": rec.checkpoint, "num_samples": num_samples}
  if sims:
    values, truths = simulated(sims, num)
    fams = families(sims, num)
    per = {n: {} for n in names + refined_names}
    # the simulations' own measuring system, as their frames were made
    refiners = [refinement.Refiner.of(rec.layout.physics, f) for f in refinements]
    by_family: dict[str, dict] = {n: {} for n in names + refined_names}
    for level in LEVELS:
      gone = level_removed(lay, level)
      v = np.where(gone[None], np.nan, values)
      r = rec.reconstruct_values(v, keep_samples=True, where=sims)
      tik = tikhonov_answers(lay, values, ~gone, alpha, seg)
      s = with_oracle(
        score_rules(rules, _evidence(rules, r), truths, extra=(tik, 0 * truths)), len(rules)
      )
      answers = rules[0].answer_of(r) if refiners else None
      for refiner in refiners:
        s = np.concatenate([s, _refined_scores(refiner, answers, v, truths)])
      for n, row in zip(names + refined_names, s):
        per[n][f"level_{level}"] = float(np.mean(row))
        if fams is not None:
          by_family[n][f"level_{level}"] = family_means(row, fams)
      log.info(f"simulations, level {level}: {time.perf_counter() - t0:.0f} s")
    result["simulations"] = {
      "folder": sims,
      "targets": len(values),
      "mean_per_target": {
        n: {**p, "all": float(np.mean(list(p.values())))} for n, p in per.items()
      },
    }
    if fams is not None:  # held-out shape families: each one's mean per level
      result["simulations"]["per_family"] = by_family
  if ktc:
    from cdeit_jax.data import ktc2023

    cases = ktc2023.read_cases(ktc, "--ktc")
    fits = challenge.calibrate(cases)
    r = challenge.model_samples(rec, cases, fits)
    truths = np.stack([c.truth for c in cases])
    linear = challenge.linear_images(cases, fits, alpha)
    tik = np.stack(challenge.answers_of(linear, seg))
    s = with_oracle(
      score_rules(rules, _evidence(rules, r), truths, extra=(tik, 0 * truths)), len(rules)
    )
    answers = rules[0].answer_of(r)
    for f in refinements:
      refined = challenge.refined(cases, fits, answers, f)[0]
      s = np.concatenate([s, score_rules([], None, truths, extra=(refined,))])
    pub = {}
    for n, row in zip(names + refined_names, s):
      levels = {
        f"level_{k}": float(sum(x for x, c in zip(row, cases) if c.level == k)) for k in LEVELS
      }
      pub[n] = {**levels, "total": float(np.sum(row))}
    result["public"] = {"folder": ktc, "targets": len(cases), "score": pub}
  result["standing"] = standing(result, [str(r) for r in rules])
  result["chosen"] = choose(result, [str(r) for r in rules])
  settings = {k: result.pop(k) for k in ("workdir", "checkpoint", "num_samples")}
  return {"metrics": result, "settings": {**settings, "seconds": time.perf_counter() - t0}}


def _refined_scores(refiner, answers: np.ndarray, values: np.ndarray, truths) -> np.ndarray:
  """(1, N) the scores of `answers` (N, 128, 128) refined against their values (N, R)."""
  return score_rules([], None, truths, extra=(refiner.refine_all(answers, values)[0],))


def _evidence(rules: list[AnswerRule], r) -> np.ndarray:
  """What the rules answer from (`AnswerRule.evidence`; all read the same, `check_model`)."""
  return rules[0].evidence(r)


def standing(result: dict, names: list[str]) -> dict[str, float]:
  """Each rule's worse standing over the sources scored (simulations, public cases): its score
  above all water's as a fraction of the best rule's there (1: the best rule on both)."""
  totals = []
  if "simulations" in result:
    totals.append({n: v["all"] for n, v in result["simulations"]["mean_per_target"].items()})
  if "public" in result:
    totals.append({n: v["total"] for n, v in result["public"]["score"].items()})
  out = {}
  for n in names:
    fractions = []
    for t in totals:
      best = max(t[m] for m in names)
      fractions.append((t[n] - t["water"]) / max(best - t["water"], 1e-12))
    out[n] = round(float(min(fractions)), 4)
  return out


def choose(result: dict, names: list[str]) -> str | None:
  """The rule with the best standing on the simulations alone; None without simulations (the
  public cases are a test: a rule kept because they rose would fit their four shapes)."""
  if "simulations" not in result:
    return None
  s = standing({"simulations": result["simulations"]}, names)
  return max(s, key=s.get)


def tables(study_json: dict) -> str:
  result = study_json["metrics"]
  out = []
  if "simulations" in result:
    s = result["simulations"]
    out.append(f"simulations ({s['targets']} targets per level, mean score per target):")
    out.append(_table(s["mean_per_target"], "all", "{:.3f}"))
  if "per_family" in result.get("simulations", {}):
    fam = result["simulations"]["per_family"]
    first = next(iter(fam))  # the first rule studied (the model's own with --rules)
    out.append(f"per held-out family, {first} / tikhonov:")
    rows = {
      f: {k: f"{fam[first][k][f]:.3f} / {fam['tikhonov'][k][f]:.3f}" for k in fam[first]}
      for f in next(iter(fam[first].values()))
    }
    head = "| family | " + " | ".join(k.replace("_", " ") for k in fam[first]) + " |"
    out += [head, "|---|" + "---|" * len(fam[first])]
    out += [f"| {f} | " + " | ".join(r.values()) + " |" for f, r in rows.items()]
  if "public" in result:
    out.append(f"public cases ({result['public']['targets']}, score summed per level):")
    out.append(_table(result["public"]["score"], "total", "{:.2f}"))
  s = result["standing"]
  top = sorted(s, key=s.get, reverse=True)[:5]
  out.append(
    "standing (the worse of the sources' (score - water) / (best - water)): "
    + ", ".join(f"{n} {s[n]:.3f}" for n in top)
  )
  chosen = result["chosen"] or "none (rules are chosen on simulations alone: give --sims)"
  out.append(f"chosen (on the simulations): {chosen}")
  return "\n".join(out)


def _table(rows: dict, last: str, fmt: str) -> str:
  head = "| rule | " + " | ".join(f"level {k}" for k in LEVELS) + f" | {last} |"
  lines = [head, "|---|" + "---|" * (len(LEVELS) + 1)]
  for name, r in rows.items():
    cells = [fmt.format(r[f"level_{k}"]) for k in LEVELS] + [fmt.format(r[last])]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
