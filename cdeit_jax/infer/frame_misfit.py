"""Whether a KTC2023 frame can tell its truth from the answers: the calibrated simulator's misfit
to each target's measured difference, for its truth, for answers, and for worse answers made
from the truth (`python -m cdeit_jax.frame_misfit`, docs/ktc2023.md).

A class map (0 water, 1 resistive, 2 conductive) is simulated with each class at 10^v times the
water's conductivity (resistive -v, conductive +v, each v on `CONTRASTS`: plastic and metal lie
beyond the water by unknown factors) and fitted to the difference d (over the level's calibrated
gain) as d = drift * F(map) + (drift - 1) * F(1): a target frame measured at `drift` times the
conductivity-free voltages of the empty tank's (`frame_drift`'s drift, here tied to the
objects'), the best (v_res, v_con) kept. The misfit is the relative residual over the values
the level has. A frame that knows its truth fits the truth below every answer that scores less;
if it does not, refining an answer against its frame follows the forward model's error, not
the truth.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from cdeit_jax.common.errors import InputError
from cdeit_jax.data.frame_drift import label_of_truth
from cdeit_jax.data.ktc2023 import Case
from cdeit_jax.eit import turns
from cdeit_jax.infer import challenge, ktc_score

CONTRASTS = (1.0, 2.0, 3.0)  # log10 of each class's conductivity ratio to the water's, tried
MOVE = 8  # pixels of the 128-grid (1/8 of the radius) a moved truth is moved by along +x
GROW = 4  # pixels a grown or shrunk truth's objects grow or shrink by


def classes(answer: np.ndarray) -> np.ndarray:
  """A challenge answer or truth (256 x 256, rows from the top) as our grid's class map (128 x
  128, rows growing with +y): each 2 x 2 block's majority class, ties to water."""
  label = label_of_truth(answer, 1.0)
  return np.where(label > 0, 2, np.where(label < 0, 1, 0)).astype(np.uint8)


def variants(truth: np.ndarray) -> dict[str, np.ndarray]:
  """Worse answers made from a class map: moved by `MOVE` pixels, objects grown and shrunk by
  `GROW` pixels, the classes swapped, all water."""
  grown, shrunk = truth.copy(), truth.copy()
  for k in (1, 2):
    grown[ndimage.binary_dilation(truth == k, iterations=GROW) & (grown == 0)] = k
    shrunk[(truth == k) & ~ndimage.binary_erosion(truth == k, iterations=GROW)] = 0
  swapped = np.where(truth == 1, 2, np.where(truth == 2, 1, 0)).astype(np.uint8)
  return {
    "truth_moved": np.roll(truth, MOVE, axis=1),
    "truth_grown": grown,
    "truth_shrunk": shrunk,
    "truth_swapped": swapped,
    "water": np.zeros_like(truth),
  }


class Fitter:
  """Fits class maps to the frames of one measuring system (module docstring), each map's
  simulated values computed once per contrast pair (a level's targets share their maps)."""

  def __init__(self, simulator, contrasts=CONTRASTS):
    self.simulator = simulator
    self.contrasts = tuple(float(v) for v in contrasts)
    self.vh = np.asarray(simulator.vh, np.float64)
    self._values: dict[tuple, np.ndarray] = {}

  def values(self, cmap: np.ndarray, v_res: float, v_con: float) -> np.ndarray:
    """F(map) (R,): the simulator's difference values of the map at these contrasts."""
    key = (cmap.tobytes(), v_res, v_con)
    if key not in self._values:
      x = np.where(cmap == 2, v_con, np.where(cmap == 1, -v_res, 0.0))
      y = self.simulator.image_voltages(np.asarray(x, self.simulator.dtype)[None])
      self._values[key] = np.asarray(y, np.float64)[0]
    return self._values[key]

  def fit(self, difference: np.ndarray, cmap: np.ndarray) -> dict[str, float]:
    """{misfit, v_resistive, v_conductive, drift} of the map's best fit to `difference` (R,),
    simulation units, NaN where the level removed a value."""
    ok = np.isfinite(difference)
    d, f1 = difference[ok], self.vh[ok]
    res = self.contrasts if (cmap == 1).any() else self.contrasts[:1]
    con = self.contrasts if (cmap == 2).any() else self.contrasts[:1]
    best = None
    for v_res in res:
      for v_con in con:
        y = self.values(cmap, v_res, v_con)[ok]
        g = y + f1
        b = float((d - y) @ g / (g @ g))
        r = float(np.linalg.norm(d - y - b * g) / np.linalg.norm(d))
        if best is None or r < best["misfit"]:
          best = {"misfit": r, "v_resistive": v_res, "v_conductive": v_con, "drift": 1 + b}
    return best


def measure(
  cases: list[Case],
  fits: dict,
  answers: dict[str, list[np.ndarray]],
  fitter_of,
  with_variants: bool = True,
  turns_deg: tuple[float, ...] = (),
) -> dict:
  """Per case (with a truth), each candidate's challenge score and fit: the truth, every
  method's answer (`answers`: name -> one 256 x 256 answer per case), the truth's `variants`,
  and the truth turned by each of `turns_deg` (counter-clockwise, degrees: where the frames put
  the tank's electrodes against the answers' grid); per level, each candidate's mean misfit
  and how many targets fit the truth below it. `fitter_of(case)`: the `Fitter` of a case's
  calibrated system."""
  per_case = {}
  for i, c in enumerate(cases):
    truth = classes(c.truth)
    cands = {"truth": truth, **{name: classes(a[i]) for name, a in answers.items()}}
    if with_variants:
      cands.update(variants(truth))
    for deg in turns_deg:
      cands[f"truth_turned_{deg:+g}"] = turns.turn_images(truth, np.deg2rad(deg), order=0)
    fitter = fitter_of(c)
    difference = challenge.calibrated_values([c], fits)[0]
    per_case[c.name] = {
      name: {"score": ktc_score.score(c.truth, _challenge_answer(m)), **fitter.fit(difference, m)}
      for name, m in cands.items()
    }
  return {"cases": per_case, "levels": summary(cases, per_case)}


def summary(cases: list[Case], per_case: dict) -> dict:
  """Per level: each candidate's mean misfit and score, and the targets whose truth fits below
  it (`truth_below`)."""
  out = {}
  for level in sorted({c.level for c in cases}):
    rows = [per_case[c.name] for c in cases if c.level == level]
    out[f"level_{level}"] = {
      name: {
        "misfit": float(np.mean([r[name]["misfit"] for r in rows])),
        "score": float(np.mean([r[name]["score"] for r in rows])),
        "truth_below": int(sum(r["truth"]["misfit"] < r[name]["misfit"] for r in rows)),
        "targets": len(rows),
      }
      for name in rows[0]
    }
  return out


def table(levels: dict) -> str:
  """Markdown: per level, each candidate's mean misfit (mean score; targets whose truth fits
  below it)."""
  names = list(next(iter(levels.values())))
  lines = ["| level | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
  for level, row in levels.items():
    cells = [
      f"{row[n]['misfit']:.3f} ({row[n]['score']:.2f}; {row[n]['truth_below']})" for n in names
    ]
    lines.append(f"| {level} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run(
  data: str,
  answers: dict[str, str],
  levels: tuple[int, ...] = (),
  with_variants: bool = True,
  turns_deg: tuple[float, ...] = (),
  contrasts=CONTRASTS,
) -> dict:
  """`python -m cdeit_jax.frame_misfit`: `measure` on the cases under `data` that have a
  truth (of `levels`, all if none), each level calibrated as eval.py calibrates it, with the
  answers of each folder of `answers` (name -> eval.py's ktc2023_challenge output,
  `level_K/N.mat`), simulated in float64 (contrasts up to 10^3)."""
  import os

  import jax

  from cdeit_jax.data import ktc2023
  from cdeit_jax.eit.simulator import Simulator

  cases = [
    c
    for c in ktc2023.read_cases(data, "--data")
    if c.truth is not None and (not levels or c.level in levels)
  ]
  if not cases:
    raise InputError(f"--data {data}: no case with a truth (trueN.mat) at the levels asked")
  given = {
    name: [
      ktc2023.read_classes(os.path.join(folder, f"level_{c.level}", f"{c.target}.mat"))
      for c in cases
    ]
    for name, folder in answers.items()
  }
  fits = challenge.calibrate(cases)
  fitters: dict = {}

  def fitter_of(case):
    device = challenge.calibrated_device(case, fits).physics
    if device not in fitters:
      fitters[device] = Fitter(Simulator(layout=device, dtype=np.float64), contrasts)
    return fitters[device]

  with jax.enable_x64(True):
    out = measure(cases, fits, given, fitter_of, with_variants, tuple(turns_deg))
  out["settings"] = {"data": data, "answers": answers, "contrasts": list(contrasts)}
  return out


def _challenge_answer(cmap: np.ndarray) -> np.ndarray:
  return ktc_score.to_challenge_grid(cmap.astype(np.uint8))
