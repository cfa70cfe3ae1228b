"""KTC2023 end to end for a reconstruction method: each target's continuous image, the
challenge's answer (a 256 x 256 array of 0/1/2), the score per target, per level and in total,
and the outputs, written whole or not at all.

Without a model (`eval.py --data ktc2023_challenge` with no `--workdir`, `linear_answers`) the
answers are the linearised method's. The linearised method (`linear_images`) calibrates the
device from each level's `ref.mat`
(`eit.calibration`: gain and contact impedance), builds the Jacobian of the challenge's
measuring system (`eit.layout.ktc2023` geometry, the file's patterns and currents) and
reconstructs each target's difference from the rows it has: a removed electrode's values are
left out of the Tikhonov system, not zero-filled. The segmentation keeps the pixels beyond
`config.eval.tikhonov_segment_level` (0.4) of the image's largest magnitude (chosen on the 28
public cases: 0.3 18.0, 0.4 20.3, 0.5 about 19; docs/ktc2023.md). The all-water answer is the
floor.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from cdeit_jax.common import fileio, logs
from cdeit_jax.common.errors import InputError
from cdeit_jax.data.ktc2023 import Case
from cdeit_jax.eit import calibration, reference_match, tikhonov, turns
from cdeit_jax.infer import answer_rules, ktc_score, outputs, refinement
from cdeit_jax.infer.frame_guards import Hints

METRICS = "metrics.json"
# what a refusal of the targets' values asks for: the challenge's files (no reconstruct flags)
HINTS = Hints(
  reference=(
    "each target's dataN.mat minus its level's ref.mat is imaged: give each level's own "
    "ref.mat (the empty tank's voltages) beside its dataN.mat"
  ),
  same="each level's ref.mat and dataN.mat, as the challenge ships them",
  skip="give those targets' voltages (NaN only on the electrodes the level removes)",
)
log = logs.log.getChild("challenge")


@dataclasses.dataclass
class Method:
  """One method's results over the cases: continuous images (128 x 128, label units, None for
  the all-water floor), answers (256 x 256, 0/1/2) and, for a model, each image's std (over a
  sampler's samples, or a segmenter's class contrast) and its class probabilities (a sampler's:
  the fractions of its samples beyond the rule's threshold)."""

  name: str
  images: list[np.ndarray | None]
  answers: list[np.ndarray]
  stds: list[np.ndarray] | None = None
  # per pixel (resistive, conductive): a segmenter's probabilities, a sampler's fractions
  probabilities: list[tuple[np.ndarray, np.ndarray]] | None = None


def calibrate(cases: list[Case]) -> dict[bytes, calibration.Calibration]:
  """The fit of every distinct reference frame among `cases` (the challenge's levels share one),
  each logged; a reference that cannot be the empty tank's is refused (`calibration.fit`), and
  then a target's frame that is not of its reference's tank, protocol, sign and units
  (`eit.reference_match.check_frames`: negated, scaled, another device's)."""
  fits: dict[bytes, calibration.Calibration] = {}
  for c in cases:
    ref = os.path.join(os.path.dirname(c.path), "ref.mat")
    if _reference_key(c) not in fits:
      fits[_reference_key(c)] = fit = calibration.fit(c.layout, c.reference, ref)
      log.info(f"calibration from {ref}: {fit.describe()}")
    reference_match.check_frames(c.frame, c.reference, c.path, ref, HINTS.same)
  return fits


def _reference_key(c: Case) -> bytes:
  return np.ascontiguousarray(c.reference).tobytes()


def linear_images(
  cases: list[Case],
  fits: dict[bytes, calibration.Calibration],
  alpha: float = tikhonov.DEFAULT_ALPHA,
) -> list[np.ndarray]:
  """Each case's Tikhonov/NOSER image (128 x 128) of its present values, in the simulator's
  units (the difference divided by the calibrated gain)."""
  images = []
  for c, diff in zip(cases, calibrated_values(cases, fits)):
    present = np.isfinite(diff)  # one matrix per removal pattern (a level's targets share it)
    images.append(tikhonov.of_values(calibrated_device(c, fits), present, alpha)(diff))
  return images


def calibrated_device(case: Case, fits: dict[bytes, calibration.Calibration]):
  """The case's measuring system at its level's calibrated contact impedance (the simulator's
  float32 of it), as the linearised answers and the frame misfit simulate it."""
  z = fits[_reference_key(case)].contact_impedance
  return case.layout.with_contact_impedance(float(np.float32(z)))


def answers_of(images: list[np.ndarray], level: float) -> list[np.ndarray]:
  return [ktc_score.to_challenge_grid(ktc_score.segment(im, level)) for im in images]


def water(cases: list[Case]) -> Method:
  zeros = np.zeros((ktc_score.SIZE, ktc_score.SIZE), np.uint8)
  return Method("water", [None] * len(cases), [zeros] * len(cases))


def scores(cases: list[Case], method: Method) -> dict | None:
  """The challenge score per target, per level and in total, of the targets whose truth is
  known (None when no truth is: `unscored` names the others)."""
  known = [(c, a) for c, a in zip(cases, method.answers) if c.truth is not None]
  if not known:
    return None
  per_target = {c.name: ktc_score.score(c.truth, a) for c, a in known}
  per_level: dict[str, float] = {}
  for c, _ in known:
    per_level[f"level_{c.level}"] = per_level.get(f"level_{c.level}", 0.0) + per_target[c.name]
  return {
    "ktc_score": sum(per_target.values()),
    "ktc_score_per_level": per_level,
    "ktc_score_per_target": per_target,
    "targets": len(known),
  }


def unscored(cases: list[Case]) -> list[str]:
  """The truth files a scored run misses (answered, not scored), named in one warning: a level
  with one missing truth is scored over the others, its count in the table says how many."""
  missing = [
    os.path.join(os.path.dirname(c.path), f"true{c.target}.mat") for c in cases if c.truth is None
  ]
  if missing and len(missing) < len(cases):
    log.warning(
      f"{len(missing)} of {len(cases)} targets have no truth ({', '.join(missing[:5])}"
      f"{', ...' if len(missing) > 5 else ''}): answered, and left out of the scores"
    )
  return missing


def table(cases: list[Case], results: dict[str, dict]) -> str:
  """A markdown table: the score per level (sum over its scored targets, their count beside the
  level) and in total, per method."""
  cases = [c for c in cases if c.truth is not None]
  levels = sorted({c.level for c in cases})
  counts = {k: sum(c.level == k for c in cases) for k in levels}
  head = "| method | " + " | ".join(f"level {k} ({counts[k]})" for k in levels) + " | total |"
  lines = [head, "|---|" + "---|" * (len(levels) + 1)]
  for name, r in results.items():
    cells = [f"{r['ktc_score_per_level'][f'level_{k}']:.2f}" for k in levels]
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['ktc_score']:.2f} of {len(cases)} |")
  return "\n".join(lines)


def output_names(cases: list[Case]) -> list[str]:
  """What `write` publishes in OUT: each target's answer, the figure, metrics.json last."""
  return [f"level_{c.level}/{c.target}.mat" for c in cases] + ["answers.png", METRICS]


def write(out: str, cases: list[Case], methods: list[Method], metrics: dict) -> list[str]:
  """OUT/level_K/N.mat per target (`reconstruction`: the first method's answer, uint8 0/1/2;
  `image`: its continuous image on the challenge's grid, rows from the top; `std`: its std;
  `p_resistive`, `p_conductive`: a segmenter's class probabilities, or the fractions of a
  sampler's samples beyond the answer rule's threshold), figures, and metrics.json last;
  staged and published whole (`outputs.publish`: files of an earlier run's levels that this
  one lacks are removed, a user's own files in OUT are kept)."""
  import scipy.io

  first = methods[0]

  def write_all(folder: str) -> list[str]:
    names = output_names(cases)
    for i, (name, image, answer) in enumerate(zip(names, first.images, first.answers)):
      path = fileio.join(folder, name)
      fileio.makedirs(fileio.dirname(path))
      arrays = {"reconstruction": np.asarray(answer, np.uint8)}
      if image is not None:
        arrays["image"] = ktc_score.to_challenge_grid(image).astype(np.float64)
      if first.stds is not None:
        arrays["std"] = ktc_score.to_challenge_grid(first.stds[i]).astype(np.float64)
      if first.probabilities is not None:
        for key, p in zip(("p_resistive", "p_conductive"), first.probabilities[i]):
          arrays[key] = ktc_score.to_challenge_grid(p).astype(np.float32)
      scipy.io.savemat(path, arrays)
    figure(fileio.join(folder, "answers.png"), cases, methods)
    fileio.write_text(
      fileio.join(folder, METRICS), json.dumps(outputs.json_clean(metrics), indent=1)
    )
    return names

  return outputs.publish(out, write_all)


def figure(path: str, cases: list[Case], methods: list[Method]) -> None:
  """Truth | each method's answer, one row per target (at most 28)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.patches import Patch

  rows = cases[:28]
  cols = 1 + len(methods)
  fig, axes = plt.subplots(
    len(rows), cols, figsize=(1.6 * cols, 1.6 * len(rows) + 0.4), squeeze=False
  )
  for i, c in enumerate(rows):
    panels = [(f"{c.name} truth", c.truth)] + [(m.name, m.answers[i]) for m in methods]
    for j, (label, a) in enumerate(panels):
      ax = axes[i, j]
      ax.axis("off")
      ax.set_title(label if a is not None else f"{label}: not known", fontsize=6)
      if a is not None:
        ax.imshow(a, cmap="viridis", vmin=0, vmax=2, interpolation="nearest")
  # the challenge's classes, as the answers' .mat files hold them
  cmap = plt.get_cmap("viridis")
  classes = ("0 water", "1 resistive", "2 conductive")
  fig.legend(
    handles=[Patch(color=cmap(k / 2), label=name) for k, name in enumerate(classes)],
    loc="upper center",
    ncol=3,
    fontsize=7,
    frameon=False,
  )
  top = 1 - 0.4 / (1.6 * len(rows) + 0.4)  # the legend's strip
  fig.subplots_adjust(left=0.02, right=0.98, top=top - 0.01, bottom=0.01, wspace=0.05, hspace=0.25)
  fig.savefig(path, dpi=80)
  plt.close(fig)


# ----------------------------------------------------------------------------- CDEIT


def model_samples(rec, cases: list[Case], fits: dict[bytes, calibration.Calibration]):
  """The `reconstructor.Reconstruction` (mean images, stds and samples (K, N, 128, 128), label
  units; a segmenter's: class probabilities) of every case by a CDEIT trained for the cases'
  measuring system: each difference divided by its level's calibrated gain, the removed
  electrodes' values NaN (`check_model` first: `evaluate` runs it before loading the model);
  turned by the angle the cases' electrodes are the model's turned by (`turns.offset`).
  Targets whose images come out NaN are named in a warning (their answers are all water)."""
  values = calibrated_values(cases, fits)
  where = os.path.dirname(cases[0].path)
  r = rec.reconstruct_values(values, where=where, keep_samples=True, hints=HINTS)
  turn = turns.offset(rec.layout, cases[0].layout)
  if turn:  # the tank's electrodes are the model's turned (a model trained on the mesh's angles)
    log.info(f"the cases' electrodes are the model's turned by {np.rad2deg(turn):.4g} degrees")
    r = r.turned(turn)
  bad = [cases[i].name for i in r.nonfinite]
  if bad:
    log.warning(f"{len(bad)} targets gave NaN images (answered as all water): {', '.join(bad)}")
  return r


def refined(cases: list[Case], fits, answers: np.ndarray, settings) -> tuple[np.ndarray, list]:
  """Each answer (N, 128, 128 class maps) refined against its case's calibrated difference
  (`refinement.Refiner`, on the case's calibrated device, one per device), and each one's
  record (objects, steps, misfits, flagged, seconds). Frames that misfit their refined answers
  far more than any real frame (`refinement.MISFIT_FLAG`) are named in one warning line; their
  answers are written as any other's (the challenge scores every file)."""
  import time

  t0 = time.perf_counter()
  refiners: dict = {}
  out, records = [], []
  for c, answer, d in zip(cases, answers, calibrated_values(cases, fits)):
    device = calibrated_device(c, fits).physics
    if device not in refiners:
      refiners[device] = refinement.Refiner.of(device, settings)
    a, rec = refiners[device].refine_all(answer[None], d[None])
    out.append(a[0])
    records += rec
  compiling = sum(r.compile_seconds for r in refiners.values())
  log.info(
    f"{len(cases)} answers refined against their frames in {time.perf_counter() - t0:.1f} s "
    f"({compiling:.1f} s of it compiling)"
  )
  if line := flagged_line(cases, records):
    log.warning(line)
  return np.stack(out), records


def flagged_line(cases: list[Case], records: list[dict]) -> str | None:
  """The warning naming the cases whose records are flagged (misfit above
  `refinement.MISFIT_FLAG` after refinement), with their misfits; None when none is."""
  bad = [f"{c.path} ({r['misfit']:.2f})" for c, r in zip(cases, records) if r.get("flagged")]
  if not bad:
    return None
  return (
    f"frames misfitting their refined answers far above any real frame ("
    f"> {refinement.MISFIT_FLAG}; the public 28: at most {refinement.PUBLIC_MISFIT_MAX}): "
    f"{', '.join(bad)}: not a tank's frames? answered as any other, likely wrong"
  )


def calibrated_values(cases: list[Case], fits: dict[bytes, calibration.Calibration]) -> np.ndarray:
  """(N, R) each case's difference divided by its level's calibrated gain (simulation units),
  NaN where its level removed a value."""
  return np.stack([c.difference / fits[_reference_key(c)].gain for c in cases])


def check_model(device, removed: np.ndarray, cases: list[Case]) -> None:
  """Refuse, naming both, cases of another measuring system than the model's (`device`), and
  name a case whose removed values are none of the model's removal sets (`removed` (K, R))."""
  from cdeit_jax.eit import conditioning

  given = cases[0].layout
  if not device.measures_as(given):
    raise InputError(
      f"{cases[0].path}: the data are of {given.describe()}, the model was trained for "
      f"{device.describe()}: train a model for this system (config.simulator.layout)"
    )
  for c in cases:
    conditioning.removal_set(removed, c.difference[None], c.path)


def linear_settings(cfg) -> tuple[float, float]:
  """(alpha, segment level) of the linearised answers, each checked: a config's
  `simulator.tikhonov_alpha` (None: `tikhonov.DEFAULT_ALPHA`) and
  `eval.tikhonov_segment_level`."""
  import math

  alpha = cfg.simulator.tikhonov_alpha
  alpha = tikhonov.DEFAULT_ALPHA if alpha is None else alpha
  level = cfg.eval.tikhonov_segment_level
  if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
    raise InputError(f"--config.simulator.tikhonov_alpha={alpha}: must be a finite number > 0")
  if not (isinstance(level, (int, float)) and 0 < level < 1):
    raise InputError(
      f"--config.eval.tikhonov_segment_level={level}: must be between 0 and 1 (a fraction of "
      "the image's largest magnitude)"
    )
  return float(alpha), float(level)


def linear_answers(data_path: str, out: str, overrides: dict | None = None) -> dict:
  """`eval.py --data ktc2023_challenge` without a model: the linearised answers
  (`linear_images`, segmented at `linear_settings`' level of each image's largest magnitude)
  and all water's for every case under `data_path`, written into `out` (`write`); returns
  metrics.json's content, with `table` when every truth is known and `targets`, the number of
  answers."""
  import time

  from cdeit_jax import config_lib
  from cdeit_jax.data import ktc2023

  t0 = time.perf_counter()
  cfg = config_lib.default_config()
  config_lib.override(cfg, dict(overrides or {}))
  alpha, segment_level = linear_settings(cfg)
  cases = ktc2023.read_cases(data_path)  # every input first: a refused one leaves no --out
  layout = cases[0].layout
  log.info(f"{len(cases)} targets of {layout.describe()}")
  fits = calibrate(cases)
  outputs.check_out(out, data_path, names=output_names(cases))
  images = linear_images(cases, fits, alpha)
  methods = [Method("tikhonov", images, answers_of(images, segment_level)), water(cases)]
  results = {m.name: scores(cases, m) for m in methods}
  metrics = {
    "metrics": {k: v for k, v in results.items() if v is not None},
    "unscored": unscored(cases),
    "settings": {
      "data": "ktc2023_challenge",
      "data_path": data_path,
      "layout": layout.describe(),
      "alpha": alpha,
      "segment_level": segment_level,
      "seconds": time.perf_counter() - t0,
    },
    "calibration": [vars(f) for f in fits.values()],
  }
  write(out, cases, methods, metrics)
  metrics["settings"]["seconds"] = time.perf_counter() - t0
  metrics["targets"] = len(cases)
  if all(r is not None for r in results.values()):
    metrics["table"] = table(cases, results)
  return metrics


def run(kind, workdir: str | None, data_path: str, out: str, overrides=None, units=None) -> dict:
  """`data_kinds`' ktc2023_challenge (it reads no units: each level is calibrated): the answers
  of the model at `workdir`, or without one the linearised answers."""
  if workdir is None:
    return linear_answers(data_path, out, overrides)
  return evaluate(workdir, data_path, out, overrides, kind)


def evaluate(
  workdir: str, data_path: str, out: str, overrides: dict | None = None, kind=None
) -> dict:
  """`eval.py --data ktc2023_challenge`: the answers of the CDEIT at `workdir` (trained for the
  challenge's system, `configs/ktc2023.py`) for every case under `data_path`, beside the
  in-tool Tikhonov's (`--config.eval.tikhonov=True`) and all water's; writes `write`'s outputs
  into `out` and returns metrics.json's content (with `table` when every truth is known)."""
  import time

  from cdeit_jax.data import ktc2023
  from cdeit_jax.infer import data_kinds, reconstructor, run_opening

  t0 = time.perf_counter()
  # every input checked first, the model loaded last of them: a refused one leaves no --out
  cases = ktc2023.read_cases(data_path)
  with run_opening.open_run(workdir, overrides) as opened:
    run, cfg, system = opened.run, opened.cfg, opened.system
    outputs.check_place(out, data_path, run.workdir)
    opened.frames.check_kind(kind or data_kinds.get("ktc2023_challenge"), workdir)
    check_model(system.device, system.removed, cases)
    e = cfg.eval
    rule = answer_rules.AnswerRule.parse(e.answer_rule)
    rule.check_model(system.output.gives_classes)
    fits = calibrate(cases)
    rec = reconstructor.Reconstructor.from_opened(opened)
    outputs.check_out(out, data_path, run.workdir, output_names(cases))
  t1 = time.perf_counter()
  r = model_samples(rec, cases, fits)
  sampled = time.perf_counter() - t1
  classes = rule.answer_of(r)
  p_res, p_con = rule.class_fractions(r)
  stds = list(r.std) if r.std is not None else None
  refine = refinement.Refinement.parse(e.refinement)
  records = None
  if refine is not None:  # the model's own answer: refined against each frame
    network = classes
    classes, records = refined(cases, fits, network, refine)
  answers = ktc_score.to_challenge_grid(classes)
  methods = [
    Method("cdeit", list(r.images), list(answers), stds, list(zip(p_res, p_con))),
  ]
  if refine is not None:  # the network's answers beside, to show what the frames changed
    methods.append(
      Method("cdeit_network", list(r.images), list(ktc_score.to_challenge_grid(network)))
    )
  if e.tikhonov:
    alpha, level = linear_settings(cfg)
    linear = linear_images(cases, fits, alpha)
    methods.append(Method("tikhonov", linear, answers_of(linear, level)))
  methods.append(water(cases))
  results = {m.name: scores(cases, m) for m in methods}
  metrics = {
    "metrics": {k: v for k, v in results.items() if v is not None},
    "unscored": unscored(cases),
    "settings": {
      "data": "ktc2023_challenge",
      "data_path": data_path,
      "checkpoint": rec.checkpoint,
      "layout": cases[0].layout.describe(),
      "num_samples": rec.num_samples,
      "sampling_steps": rec.steps,
      "answer_rule": str(rule),
      "refinement": "" if refine is None else str(refine),
      "tikhonov_segment_level": float(e.tikhonov_segment_level),
      "sampling_seconds": sampled,
      "seconds": time.perf_counter() - t0,
    },
    "calibration": [vars(f) for f in fits.values()],
  }
  if records is not None:
    metrics["refinement"] = {c.name: rec for c, rec in zip(cases, records)}
  write(out, cases, methods, metrics)
  if all(r is not None for r in results.values()):
    metrics["table"] = table(cases, results)
  return metrics
